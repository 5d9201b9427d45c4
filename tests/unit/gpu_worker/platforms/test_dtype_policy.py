"""Each platform's dtype policy: `--dtype auto` keeps half checkpoints where the device computes them and serves fp32
ones in bfloat16 where it is fast at it; `--kv-cache-dtype auto` is the model's, but fp16 under fp32 on CPU."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.platforms.cpu import platform as cpu_platform
from pagedserve.services.gpu_worker.platforms.cpu.cpu_flags import cpu_has_amx, cpu_has_fast_bf16
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform


@pytest.mark.parametrize(("flags", "fast", "amx"), [
    ("fpu sse avx2 avx512f avx512_bf16 amx_tile", True, False),
    ("fpu sse avx2 amx_bf16 amx_tile", True, True),
    ("fpu sse avx2 avx512f avx512_vnni", False, False),
])
def test_cpu_flags(tmp_path, flags: str, fast: bool, amx: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert cpu_has_fast_bf16(str(cpuinfo)) is fast
    assert cpu_has_amx(str(cpuinfo)) is amx


def test_missing_cpuinfo_means_no_bf16(tmp_path) -> None:
    assert cpu_has_fast_bf16(str(tmp_path / "absent")) is False
    assert cpu_has_amx(str(tmp_path / "absent")) is False


@pytest.mark.parametrize("fast", [True, False])
def test_auto_rules_on_cpu(monkeypatch, fast: bool) -> None:
    monkeypatch.setattr(cpu_platform, "cpu_has_fast_bf16", lambda: fast)
    cpu = CpuPlatform(native_kernels=False)
    half = torch.bfloat16 if fast else torch.float32
    assert cpu.serving_dtype(torch.float32) == half
    assert cpu.serving_dtype(torch.float16) == half  # fp16 matmuls are slow on CPUs
    assert cpu.serving_dtype(torch.bfloat16) == torch.bfloat16


@pytest.mark.parametrize("bf16", [True, False])
def test_auto_rules_on_cuda(monkeypatch, bf16: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    cuda = CudaPlatform(torch.device("cuda"))  # touches no device
    assert cuda.serving_dtype(torch.float32) == (torch.bfloat16 if bf16 else torch.float32)
    assert cuda.serving_dtype(torch.float16) == torch.float16
    assert cuda.serving_dtype(torch.bfloat16) == torch.bfloat16


def test_kv_cache_dtype() -> None:
    """auto: fp16 for an fp32 model on CPU, else the model's; an explicit narrower cache only on CPU."""
    cpu, cuda = CpuPlatform(native_kernels=False), CudaPlatform(torch.device("cuda"))
    assert cpu.kv_cache_dtype("auto", torch.float32) == torch.float16
    assert cpu.kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert cuda.kv_cache_dtype("auto", torch.float32) == torch.float32
    assert cpu.kv_cache_dtype("float32", torch.float32) == torch.float32
    assert cpu.kv_cache_dtype("float16", torch.bfloat16) == torch.float16
    assert cuda.kv_cache_dtype("bfloat16", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="only supported on CPU"):
        cuda.kv_cache_dtype("float16", torch.bfloat16)
    with pytest.raises(ValueError, match="unsupported dtype"):
        cpu.kv_cache_dtype("int8", torch.float32)


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_fp8_kv_cache_is_cuda_only(name: str) -> None:
    """CUDA: an e4m3 cache under any model dtype; CPU: a clear refusal naming the flag (no CPU path reads e4m3)."""
    cuda = CudaPlatform(torch.device("cuda"))
    for model in (torch.bfloat16, torch.float16, torch.float32):
        assert cuda.kv_cache_dtype(name, model) == torch.float8_e4m3fn
    with pytest.raises(ValueError, match=f"--kv-cache-dtype {name} is GPU-only.*runs on cpu"):
        CpuPlatform(native_kernels=False).kv_cache_dtype(name, torch.float32)


def test_fp8_kv_cache_needs_the_triton_backend_on_cuda() -> None:
    cuda = CudaPlatform(torch.device("cuda"), torch_compile=False)
    shape = AttentionShape(4, 2, 64, 0.125)
    with pytest.raises(ValueError, match="fp8 needs --attention-backend triton"):
        cuda.attention_backend("torch", shape, torch.bfloat16, torch.float8_e4m3fn, 16)
    assert cuda.attention_backend("torch", shape, torch.bfloat16, torch.bfloat16, 16).name == "torch"


def _checkpoint(folder, weight: torch.Tensor):
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"model.layers.0.self_attn.q_proj.weight": weight, "model.norm.weight": torch.ones(64)},
              str(folder / "model.safetensors"))
    return folder


def _grid_weight(out: int = 64, inputs: int = 64) -> torch.Tensor:
    """Exact 4-bit codes (0 and 15 in every group of 32) times a power-of-two scale plus a per-group offset."""
    codes = torch.randint(0, 16, (out, inputs), generator=torch.Generator().manual_seed(0)).float()
    codes[:, ::32], codes[:, 1::32] = 0.0, 15.0
    offsets = torch.arange(out * inputs // 32, dtype=torch.float32).reshape(out, -1, 1) / 16 - 2
    return (codes.reshape(out, -1, 32) / 16 + offsets).reshape(out, inputs)


@pytest.mark.parametrize("fast", [True, False])
def test_fp32_checkpoints_of_4bit_grids_stay_fp32_for_the_int8_kernel(monkeypatch, tmp_path, fast: bool) -> None:
    """The int8 kernel reads half a byte a weight: a GGUF-derived fp32 checkpoint is served in fp32 even where bf16
    is fast; an fp32 checkpoint of ordinary weights still goes to bf16 there."""
    monkeypatch.setattr(cpu_platform, "cpu_has_fast_bf16", lambda: fast)
    half = torch.bfloat16 if fast else torch.float32
    grid, plain = _checkpoint(tmp_path / "grid", _grid_weight()), _checkpoint(tmp_path / "plain", torch.randn(64, 64))
    cpu = CpuPlatform(int8_activations=True)
    assert cpu.native is not None and cpu.native.int8_linear is not None  # the C kernel builds on every CI CPU
    assert cpu.serving_dtype(torch.float32, str(grid)) == torch.float32
    assert cpu.serving_dtype(torch.float32, str(plain)) == half
    assert cpu.serving_dtype(torch.bfloat16, str(grid)) == torch.bfloat16
    assert CpuPlatform(int8_activations=False).serving_dtype(torch.float32, str(grid)) == half
    assert CpuPlatform(native_kernels=False, int8_activations=True).serving_dtype(torch.float32, str(grid)) == half


def test_a_cpu_worker_refuses_fp8_kv_at_start(tmp_path) -> None:
    """The refusal comes before any weight is loaded, naming the flag and the platform."""
    from pagedserve.services.gpu_worker.model_runner import ModelRunner
    from pagedserve.services.gpu_worker.worker_config import WorkerConfig
    from tests.unit.gpu_worker.tiny_models import make_tiny_model

    make_tiny_model("llama", tmp_path)
    config = WorkerConfig(model_dir=str(tmp_path), device="cpu", kv_cache_dtype="fp8", native_kernels=False,
                          torch_compile=False)
    with pytest.raises(ValueError, match="--kv-cache-dtype fp8 is GPU-only"):
        ModelRunner(config)
