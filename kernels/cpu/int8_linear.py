"""The C int8 GEMM (int8_linear.c): x [rows, in] fp32 @ weight[out, in].T (+ bias) for weights that are exact 4-bit
grids (weight_grid.py), with x quantized to int8 per row and 32 inputs inside the call."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.build import bind, load_kernel
from pagedserve.kernels.cpu.packed_linear import PANEL as PANEL  # int8_linear.c pads to the same panels (padded_rows)
from pagedserve.kernels.cpu.packed_linear import checked_io, padded_rows, to_panels
from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid

_ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 4


@dataclass(frozen=True)
class Int8Weight:
    """A 4-bit grid weight [out, in] in panels of 16 output columns: codes [panels, in / 4, 32] uint8 (byte 4j + i
    of quad t: column j's input 4t + i in the low nibble, column j + 8's in the high one), scales and offsets
    [panels, in / 32, 16] fp32. The kernel reads the inputs it keeps in fp32 (outliers) from the same panels."""

    out_features: int
    in_features: int
    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.codes, self.scales, self.offsets)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def pack_grid(grid: WeightGrid) -> Int8Weight:
    """A 4-bit WeightGrid -> the kernel's panels (columns past the last are zero codes with zero scales)."""
    if not supports(grid):
        raise ValueError(f"the int8 GEMM takes 4-bit grids of 32 inputs, not {grid.bits}-bit ones of {grid.group}")
    out_features, in_features = grid.codes.shape
    codes = padded_rows(grid.codes).view(-1, 2, 8, in_features // 4, 4).permute(0, 3, 2, 4, 1)
    panels = codes.shape[0]
    nibbles = (codes[..., 0] | (codes[..., 1] << 4)).reshape(panels, in_features // 4, 32)
    return Int8Weight(out_features, in_features, nibbles.contiguous(), to_panels(grid.scales),
                      to_panels(grid.offsets))


def supports(grid: WeightGrid | None) -> bool:
    return grid is not None and grid.bits == 4 and grid.group == GROUP and grid.codes.shape[1] % GROUP == 0


class Int8Linear:
    def __init__(self) -> None:
        self.q4 = bind(load_kernel("int8_linear"), "int8_linear_q4", _ARGTYPES)

    def __call__(self, x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] fp32 through a packed 4-bit weight."""
        x, bias, out = checked_io(x, bias, weight.in_features, weight.out_features, "int8 linear", "4-bit")
        if not x.shape[0]:
            return out
        bias_ptr = 0 if bias is None else bias.data_ptr()
        failed = self.q4(x.data_ptr(), *(t.data_ptr() for t in weight.tensors()), bias_ptr, out.data_ptr(),
                         x.shape[0], weight.in_features, weight.out_features, torch.get_num_threads())
        if failed:
            raise MemoryError("the C int8 linear kernel could not allocate its quantized rows")
        return out
