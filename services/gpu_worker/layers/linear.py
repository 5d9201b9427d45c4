"""Projections, with a compiled single-row path for CPU decode.

A one-token step multiplies a single row by every weight matrix: pure weight streaming. torch's CPU GEMM reaches
about 13 GB/s there (bf16, 2 threads on the CI machine), an Inductor-generated dot-product loop about 21 GB/s, so
`Projector` sends single rows through the compiled loop and everything else through F.linear.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from services.gpu_worker.compiling import compile_function

log = logging.getLogger(__name__)


def row_times_weight(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, in] @ weight[out, in].T (+ bias), accumulated in fp32."""
    out = (x.float() * weight.float()).sum(-1, keepdim=True).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


class Projector:
    """Calls F.linear, or the compiled single-row product when enabled (CPU only)."""

    def __init__(self, compile_single_row: bool) -> None:
        self.single_row = compile_function(row_times_weight, dynamic=False) if compile_single_row else None

    def __call__(self, x: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
        """x [T, in] through a Linear (or a tied Embedding's weight)."""
        bias = getattr(layer, "bias", None)
        if self.single_row is not None and x.shape[0] == 1:
            return self.single_row(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    @torch.inference_mode()
    def warm_up(self, layers: list[torch.nn.Module]) -> None:
        """Compile the single-row graph of each distinct weight shape up front (not in the first request)."""
        if self.single_row is None:
            return
        shapes = {(tuple(layer.weight.shape), getattr(layer, "bias", None) is not None): layer for layer in layers}
        try:
            for layer in shapes.values():
                self(torch.zeros(1, layer.weight.shape[1], dtype=layer.weight.dtype, device=layer.weight.device), layer)
        except Exception as exc:  # a missing C++ compiler, an unsupported platform
            log.warning("torch.compile of one-row matmuls failed (%s: %s); using F.linear", type(exc).__name__, exc)
            self.single_row = None
