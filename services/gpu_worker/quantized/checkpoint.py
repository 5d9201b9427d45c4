"""A quantized safetensors folder's tensors under the Hugging Face names the loader maps to DecoderLM: GPTQ / AWQ
modules as WeightGrids (int4.py), FP8 weights dequantized to fp32 (fp8.py) or, for a platform that keeps them,
kept as FP8Weights (per-tensor and per-channel scales; block-scaled ones are still dequantized), everything else as
stored."""

from __future__ import annotations

import logging

import torch

from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.kernels.weight_only_formats import FP8Weight
from pagedserve.services.gpu_worker.quantized.fp8 import FP8_DTYPES, fp8_weight
from pagedserve.services.gpu_worker.quantized.int4 import awq_weight, gptq_weight
from pagedserve.services.gpu_worker.quantized.scheme import QuantScheme

log = logging.getLogger(__name__)
Weight = torch.Tensor | WeightGrid | FP8Weight
_INT4_PARTS = ("qweight", "qzeros", "scales", "g_idx")
_FP8_SCALES = ("weight_scale", "weight_scale_inv")
_IGNORED = ("input_scale", "weight_zero_point", "output_scale", "k_scale", "v_scale")  # activation/KV scales


def quantized_state(tensors: dict[str, torch.Tensor], scheme: QuantScheme,
                    keep_fp8: bool = False) -> dict[str, Weight]:
    """Every module's weight as a grid (int4) or an fp32 tensor (fp8; an FP8Weight where `keep_fp8` and its
    scale is per tensor or per channel), the other tensors unchanged."""
    if scheme.method == "fp8":
        return _fp8_state(tensors, keep_fp8)
    modules: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, Weight] = {}
    for name, tensor in tensors.items():
        prefix, _, part = name.rpartition(".")
        if part in _INT4_PARTS:
            modules.setdefault(prefix, {})[part] = tensor
        else:
            out[name] = tensor
    convert = gptq_weight if scheme.method == "gptq" else awq_weight
    for prefix, parts in modules.items():
        missing = [p for p in _INT4_PARTS[:3] if p not in parts]
        if missing:
            raise ValueError(f"{scheme.method} module {prefix!r} lacks {', '.join(missing)}")
        out[f"{prefix}.weight"] = convert(parts, scheme)
    dense = [name for name, w in out.items() if name.endswith("proj.weight") and isinstance(w, torch.Tensor)
             and name.removesuffix(".weight") in modules]
    if dense:
        log.warning("%d %s weights (act-order g_idx, or groups not a multiple of 32) are dequantized to fp32: "
                    "%.1f MiB", len(dense), scheme.method, sum(out[n].numel() * 4 for n in dense) / 2**20)
    return out


def _fp8_state(tensors: dict[str, torch.Tensor], keep_fp8: bool) -> dict[str, Weight]:
    out: dict[str, Weight] = {}
    count = kept = 0
    for name, tensor in tensors.items():
        prefix, _, part = name.rpartition(".")
        if part in _FP8_SCALES or part in _IGNORED:
            continue
        if tensor.dtype in FP8_DTYPES:
            scale = next((tensors[f"{prefix}.{s}"] for s in _FP8_SCALES if f"{prefix}.{s}" in tensors), None)
            if scale is None:
                raise ValueError(f"fp8 weight {name!r} has no weight_scale")
            if keep_fp8 and scale.numel() in (1, tensor.shape[0]) and "embed_tokens" not in name:
                out[name] = FP8Weight.from_fp8(tensor, scale)
                kept += tensor.numel()
                continue
            tensor = fp8_weight(tensor, scale)
            count += tensor.numel()
        out[name] = tensor
    if kept:
        log.info("fp8 weights kept as fp8: %.1f MiB (+ one fp32 scale a row)", kept / 2**20)
    if count:
        log.info("fp8 weights dequantized at load: %.1f MiB in the checkpoint take %.1f MiB in bf16, %.1f MiB in "
                 "fp32", count / 2**20, count * 2 / 2**20, count * 4 / 2**20)
    return out
