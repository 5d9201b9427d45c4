"""Find fp32 weights that are exactly integer codes on a grid per 32 inputs: q * scale + offset (rounded in fp32).

A model dequantized from a 4- or 8-bit checkpoint (GGUF Q4_1 or Q8_0: the default model) keeps those grids in
its fp32 weights. Stored as codes, the same numbers take a fifth of the bytes, which is what a decode step
streams. The check is exact: a weight is coded only when every value comes back bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32  # inputs per (scale, offset)


@dataclass(frozen=True)
class WeightGrid:
    """weight[o, k] == codes[o, k] * scales[o, k // group] + offsets[o, k // group], exactly in fp32 (codes times
    scales exact: few enough significant bits, as in fp16 scales or GGUF's K-quant scales)."""

    codes: torch.Tensor  # [out, in]: uint8 in [0, 15] for 4 bits, int8 for 8
    scales: torch.Tensor  # [out, in / group] fp32
    offsets: torch.Tensor  # [out, in / group] fp32
    bits: int
    group: int = GROUP  # 32, or 16 (8-bit codes only: GGUF Q6_K)


def find_grid(weight: torch.Tensor) -> WeightGrid | None:
    """The 4-bit affine grid (codes 0-15 from each group's minimum) or else the 8-bit symmetric one (codes
    -127-127, offset 0) that reproduces the fp32 `weight` [out, in] exactly, or None."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % GROUP:
        return None
    groups = weight.reshape(weight.shape[0], -1, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    found = _codes(groups, (high - low) / 15, low, 0, 15)
    if found is not None:
        return WeightGrid(found[0].to(torch.uint8).flatten(1), found[1].squeeze(-1), low.squeeze(-1), 4)
    zero = torch.zeros_like(low)
    found = _codes(groups, groups.abs().amax(-1, keepdim=True) / 127, zero, -127, 127)
    if found is not None:
        return WeightGrid(found[0].to(torch.int8).flatten(1), found[1].squeeze(-1), zero.squeeze(-1), 8)
    return None


def _codes(groups: torch.Tensor, step: torch.Tensor, offset: torch.Tensor, lowest: int,
           highest: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes, scales) with scale = `step` rounded to fp16 when they give back `groups` exactly, else None."""
    scale = step.half().float()
    if not torch.isfinite(scale).all():
        return None
    codes = torch.where(scale > 0, (groups - offset) / scale, 0.0).round().clamp(lowest, highest)
    if not torch.equal(codes * scale + offset, groups):
        return None
    return codes, scale
