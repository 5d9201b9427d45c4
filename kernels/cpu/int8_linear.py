"""The C int8 GEMM (int8_linear.c): x [rows, in] fp32 @ weight[out, in].T (+ bias) for weights that are exact 4-bit
grids (weight_grid.py) or 8-bit ones (GGUF Q5_0 / Q5_1 / Q5_K / Q8_0 / Q6_K blocks), with x quantized to int8 per row
and 32 inputs inside the call."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.build import bind, load_kernel
from pagedserve.kernels.cpu.packed_linear import PANEL as PANEL  # int8_linear.c pads to the same panels (padded_rows)
from pagedserve.kernels.cpu.packed_linear import checked_io, padded_rows, to_panels
from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid

_CODED_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 4
EIGHT_BIT_GROUPS = (16, 32)  # inputs per scale of 8-bit codes (16: GGUF Q6_K)


@dataclass(frozen=True)
class Int8Weight:
    """A grid weight [out, in] in panels of 16 output columns: 4-bit codes [panels, in / 4, 32] uint8 (byte 4j + i
    of quad t: column j's input 4t + i in the low nibble, column j + 8's in the high one) or 8-bit codes
    [panels, in / 4, 64] int8 (byte 4j + i of quad t: column j's input 4t + i), scales and offsets
    [panels, in / group, 16] fp32. The kernel reads the inputs it keeps in fp32 (outliers) from the same panels."""

    out_features: int
    in_features: int
    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    bits: int = 4
    group: int = GROUP

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.codes, self.scales, self.offsets)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def pack_grid(grid: WeightGrid) -> Int8Weight:
    """A 4- or 8-bit WeightGrid -> the kernel's panels (columns past the last are zero codes with zero scales)."""
    if not supports(grid):
        raise ValueError(f"the int8 GEMM takes 4-bit grids of 32 inputs and 8-bit ones of 16 or 32 (rows of whole "
                         f"32s), not {grid.bits}-bit ones of {grid.group}")
    out_features, in_features = grid.codes.shape
    if grid.bits == 8:
        codes = padded_rows(grid.codes).view(-1, PANEL, in_features // 4, 4).transpose(1, 2)
        return Int8Weight(out_features, in_features, codes.reshape(-1, in_features // 4, 4 * PANEL).contiguous(),
                          to_panels(grid.scales), to_panels(grid.offsets), 8, grid.group)
    codes = padded_rows(grid.codes).view(-1, 2, 8, in_features // 4, 4).permute(0, 3, 2, 4, 1)
    panels = codes.shape[0]
    nibbles = (codes[..., 0] | (codes[..., 1] << 4)).reshape(panels, in_features // 4, 32)
    return Int8Weight(out_features, in_features, nibbles.contiguous(), to_panels(grid.scales),
                      to_panels(grid.offsets))


def supports(grid: WeightGrid | None) -> bool:
    if grid is None or grid.codes.shape[1] % GROUP:
        return False
    return (grid.bits == 4 and grid.group == GROUP) or (grid.bits == 8 and grid.group in EIGHT_BIT_GROUPS)


class Int8Linear:
    def __init__(self, library: ctypes.CDLL | None = None) -> None:
        """`library`: int8_linear.c built otherwise (tests: without AVX512-VNNI); default: built for this CPU."""
        library = library if library is not None else load_kernel("int8_linear")
        self.coded = bind(library, "int8_linear_coded", _CODED_ARGTYPES)

    def __call__(self, x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] fp32 through a packed 4- or 8-bit weight."""
        x, bias, out = checked_io(x, bias, weight.in_features, weight.out_features, "int8 linear",
                                  f"{weight.bits}-bit")
        if not x.shape[0]:
            return out
        bias_ptr = 0 if bias is None else bias.data_ptr()
        codes, scales, offsets = (t.data_ptr() for t in weight.tensors())
        failed = self.coded(x.data_ptr(), codes, scales, offsets, weight.bits, weight.group, bias_ptr,
                            out.data_ptr(), x.shape[0], weight.in_features, weight.out_features,
                            torch.get_num_threads())
        if failed == 3:
            raise ValueError(f"the C int8 linear kernel takes no {weight.bits}-bit codes in groups of {weight.group}")
        if failed:
            raise MemoryError("the C int8 linear kernel could not allocate its quantized rows")
        return out
