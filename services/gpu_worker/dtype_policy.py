"""Which dtype to serve in, and to keep the KV cache in, when the user says `auto`.

Like vLLM's `auto`, a half-precision checkpoint keeps its dtype and an fp32 checkpoint is served in 16 bits where
the device computes them fast: bfloat16 on CUDA devices that support it and on CPUs with AVX512-BF16 or AMX
(about 2.5x the fp32 matmul rate on a Zen 4 EPYC, at half the weight and KV-cache bytes); otherwise fp32
(an AVX2-only Zen 3 EPYC runs bf16 matmuls about 9x slower than fp32).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from services.gpu_worker.model_config import parse_dtype

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU flags (empty where the cpuinfo file is missing)."""
    path = Path(cpuinfo)
    lines = path.read_text().splitlines() if path.is_file() else []
    return frozenset(next((line.split(":", 1)[-1] for line in lines if line.startswith("flags")), "").split())


def cpu_has_fast_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    return any(flag in cpu_flags(cpuinfo) for flag in _CPU_BF16_FLAGS)


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    return "amx_bf16" in cpu_flags(cpuinfo)


def device_has_fast_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_fast_bf16()


def auto_dtype(checkpoint: torch.dtype, device: torch.device) -> torch.dtype:
    """The serving dtype for `--dtype auto`, given the checkpoint's dtype."""
    if checkpoint == torch.bfloat16 or (checkpoint == torch.float16 and device.type == "cuda"):
        return checkpoint
    return torch.bfloat16 if device_has_fast_bf16(device) else torch.float32



def kv_cache_dtype(name: str, model: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's dtype for `--kv-cache-dtype`: `auto` is the model's, except float16 for an fp32 model on CPU
    (half the bytes a decode step reads and twice the tokens per GiB; scores and sums stay fp32). Any other choice
    than the model's is CPU-only (the Triton kernels read the model's dtype)."""
    if name == "auto":
        return torch.float16 if model == torch.float32 and device.type == "cpu" else model
    chosen = parse_dtype(name, model)
    if chosen != model and device.type != "cpu":
        raise ValueError(f"a {name} KV cache under a {model} model is only supported on CPU")
    return chosen
