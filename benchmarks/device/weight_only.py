"""Section: the weight-only Triton GEMMs (GPTQ / AWQ int4, FP8) the CUDA platform runs quantized checkpoints with,
at Llama-3.2-1B's MLP widths (gate_up 2048 -> 16384, down 8192 -> 2048) in bf16 for 1, 16, 32 and 256 rows:
correct against F.linear over the same weight dequantized to bf16 (max error relative to max |ref|, <= 2e-2), and
timed against that dequantize-then-F.linear fallback and against F.linear over a resident bf16 weight, the figures
that should set cuda_linear.TRITON_MAX_ROWS (a guess until this runs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.benchmarks.device.context import Section
from pagedserve.benchmarks.device.timing import time_calls
from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.kernels.weight_only_formats import FP8Weight, Int4Weight

SHAPES = {"gate_up": (16384, 2048), "down": (2048, 8192)}  # (out, in)
TOY_SHAPES = {"gate_up": (96, 64)}
ROWS, TOY_ROWS = (1, 16, 32, 256), (1, 3)
REPS = 30
MAX_REL_ERR = 2e-2  # bf16 operands and output; an indexing or decoding bug gives O(1)


def _weights(out_features: int, in_features: int) -> dict[str, Int4Weight | FP8Weight]:
    gen = torch.Generator().manual_seed(out_features + in_features)
    groups = in_features // 32
    scales = (torch.rand(out_features, groups, generator=gen) * 0.02 + 1e-3).half().float()
    zeros = torch.randint(0, 16, (out_features, groups), generator=gen).float()
    codes = torch.randint(0, 16, (out_features, in_features), generator=gen).to(torch.uint8)
    fp8 = (torch.randn(out_features, in_features, generator=gen) * 64).to(torch.float8_e4m3fn)
    return {"int4": Int4Weight.from_grid(WeightGrid(codes, scales, -zeros * scales, 4)),
            "fp8": FP8Weight.from_fp8(fp8, torch.rand(out_features, 1, generator=gen) * 1e-3)}


def run(section: Section) -> str | None:
    shapes, all_rows = (TOY_SHAPES, TOY_ROWS) if section.dry_run else (SHAPES, ROWS)
    failed = []
    for shape_name, (out_features, in_features) in shapes.items():
        for kind, weight in _weights(out_features, in_features).items():
            for rows in all_rows:
                if section.out_of_time(f"{kind} {shape_name} at {rows} rows"):
                    return "timed out: box spent (partial rows)"
                if not _measure(section, kind, shape_name, weight.to(section.device), rows):
                    failed.append(f"{kind} {shape_name} {rows}")
    return f"failed: relative error over {MAX_REL_ERR}: {', '.join(failed)}" if failed else None


def _measure(section: Section, kind: str, shape_name: str, weight: Int4Weight | FP8Weight, rows: int) -> bool:
    """One row: the kernel's error and its time against the two F.linear paths; whether the error is in bound."""
    from pagedserve.kernels.weight_only_linear import fp8_linear, int4_linear

    dtype = torch.float32 if section.dry_run else torch.bfloat16
    dense = weight.dequantize(dtype)
    x = torch.randn(rows, dense.shape[1], device=section.device, dtype=dtype)

    def kernel() -> torch.Tensor:
        return int4_linear(x, weight) if isinstance(weight, Int4Weight) else fp8_linear(x, weight)

    ref = F.linear(x.float(), dense.float())
    err = ((kernel().float() - ref).abs().max() / ref.abs().max()).item()
    reps, graphs = (1 if section.dry_run else REPS), section.state.capture_ok
    triton_t = time_calls([kernel], section.device, graphs, reps)
    fallback_t = time_calls([lambda: F.linear(x, weight.dequantize(dtype))], section.device, graphs, reps)
    dense_t = time_calls([lambda: F.linear(x, dense)], section.device, graphs, reps)
    section.row(kernel=kind, shape=shape_name, rows=rows, rel_err=err, err_ok=err <= MAX_REL_ERR,
                triton_ms=triton_t.ms, dequant_fallback_ms=fallback_t.ms, dense_bf16_ms=dense_t.ms, how=triton_t.how)
    return err <= MAX_REL_ERR
