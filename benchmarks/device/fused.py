"""Section: the CUDA platform's fused layer kernels against the portable torch ops they replace, graph-timed, at
Llama-3.2-1B's widths (hidden 2048, 32 + 8 heads of 64, MLP 8192) for 1 and 256 rows."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pagedserve.benchmarks.device.context import Section
from pagedserve.benchmarks.device.timing import time_calls
from pagedserve.services.gpu_worker.layers.activation import silu_and_mul
from pagedserve.services.gpu_worker.layers.norm import rms_norm
from pagedserve.services.gpu_worker.layers.rotary import apply_rotary

WIDTHS = {"hidden": 2048, "q_heads": 32, "kv_heads": 8, "head_dim": 64, "mlp": 8192}
TOY_WIDTHS = {"hidden": 64, "q_heads": 4, "kv_heads": 2, "head_dim": 16, "mlp": 96}
ROWS, TOY_ROWS = (1, 256), (1, 4)
REPS = 50


def _pairs(rows: int, w: dict, device: torch.device, dtype: torch.dtype) -> dict[str, tuple[Callable, Callable]]:
    """name -> (fused call, torch call) on the same inputs."""
    from pagedserve.kernels.fused_rms_norm import fused_rms_norm
    from pagedserve.kernels.rotary_embedding import rotary_in_place
    from pagedserve.kernels.silu_and_mul import fused_silu_and_mul

    gen = torch.Generator(device=device).manual_seed(rows)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    x, residual, weight = randn(rows, w["hidden"]), randn(rows, w["hidden"]), randn(w["hidden"])
    heads, d = w["q_heads"] + 2 * w["kv_heads"], w["head_dim"]
    qkv = randn(rows, heads, d)
    q, k = qkv[:, :w["q_heads"]], qkv[:, w["q_heads"]:w["q_heads"] + w["kv_heads"]]
    cos, sin = randn(rows, 1, d // 2), randn(rows, 1, d // 2)
    gate_up = randn(rows, 2 * w["mlp"])
    return {
        "rms_norm+residual": (lambda: fused_rms_norm(x, weight, 1e-5, residual),
                              lambda: rms_norm(x, weight, 1e-5, residual)),
        "rotary": (lambda: rotary_in_place(q, k, cos, sin), lambda: apply_rotary(q, k, cos, sin)),
        "silu_and_mul": (lambda: fused_silu_and_mul(gate_up), lambda: silu_and_mul(gate_up)),
    }


def run(section: Section) -> str | None:
    widths, all_rows = (TOY_WIDTHS, TOY_ROWS) if section.dry_run else (WIDTHS, ROWS)
    dtype = torch.float32 if section.dry_run else torch.bfloat16
    for rows in all_rows:
        for name, (fused, reference) in _pairs(rows, widths, section.device, dtype).items():
            if section.out_of_time(f"{name} at {rows} rows"):
                return "timed out: box spent (partial rows)"
            reps = 1 if section.dry_run else REPS
            fused_t = time_calls([fused], section.device, section.state.capture_ok, reps)
            torch_t = time_calls([reference], section.device, section.state.capture_ok, reps)
            section.row(kernel=name, rows=rows, fused_ms=fused_t.ms, torch_ms=torch_t.ms,
                        speedup=torch_t.ms / fused_t.ms, how=fused_t.how)
    return None
