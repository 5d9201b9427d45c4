"""SiLU-and-multiply, the gated MLP's activation."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

ActivationKernel = Callable[[torch.Tensor], torch.Tensor]  # gate_up [T, 2W] -> [T, W]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The portable kernel: silu(gate) * up, gate and up the two halves of the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
