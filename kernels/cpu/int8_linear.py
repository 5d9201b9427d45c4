"""The C int8 GEMM (int8_linear.c): x [rows, in] fp32 @ weight[out, in].T (+ bias) for weights that are exact 4-bit
grids (weight_grid.py) or 8-bit ones (GGUF Q5_0 / Q5_1 / Q5_K / Q8_0 / Q6_K blocks), with x quantized to int8 per row
and 32 inputs inside the call.

An 8-bit grid of 32-input groups whose codes all lie in [base, base + 31] (base -16: GGUF Q5_0; 0: Q5_1 / Q5_K) is
packed as 5-bit codes: 5 bits a weight in memory instead of 8, expanded back to the same integers inside the kernel,
so the outputs are those of its 8-bit packing bit for bit."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.build import bind, load_kernel
from pagedserve.kernels.cpu.packed_linear import PANEL as PANEL  # int8_linear.c pads to the same panels (padded_rows)
from pagedserve.kernels.cpu.packed_linear import checked_io, padded_rows, to_panels
from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid

_CODED_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 4
EIGHT_BIT_GROUPS = (16, 32)  # inputs per scale of 8-bit codes (16: GGUF Q6_K)
FIVE_BIT_BASES = (-16, 0)  # the code a stored 0 stands for in 5-bit codes: GGUF Q5_0's signed codes, Q5_x's unsigned
FIVE_BIT_GROUP_BYTES = 320  # 5-bit codes of one panel and group: 8 quads of nibbles (256 B), their fifth bits (64 B)


@dataclass(frozen=True)
class Int8Weight:
    """A grid weight [out, in] in panels of 16 output columns: 4-bit codes [panels, in / 4, 32] uint8 (byte 4j + i
    of quad t: column j's input 4t + i in the low nibble, column j + 8's in the high one), 8-bit codes
    [panels, in / 4, 64] int8 (byte 4j + i of quad t: column j's input 4t + i) or 5-bit codes [panels, in / 32, 320]
    uint8 (per group of 32 inputs, u = code - base: the 4-bit layout of u & 15 for its 8 quads, then each quad's
    fifth bits u >> 4 as a little-endian 64-bit word, bit 4j + i for column j in 0-15 and input 4t + i), scales and
    offsets [panels, in / group, 16] fp32. The kernel reads the inputs it keeps in fp32 (outliers) from the same
    panels."""

    out_features: int
    in_features: int
    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor
    bits: int = 4
    group: int = GROUP
    base: int = 0  # 5-bit codes: the code of a stored 0 (FIVE_BIT_BASES)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.codes, self.scales, self.offsets)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def pack_grid(grid: WeightGrid, five_bit: bool = True) -> Int8Weight:
    """A 4- or 8-bit WeightGrid -> the kernel's panels (columns past the last are zero codes with zero scales); an
    8-bit one whose codes fit 5 bits (five_bit_base) as 5-bit codes unless `five_bit` is False."""
    if not supports(grid):
        raise ValueError(f"the int8 GEMM takes 4-bit grids of 32 inputs and 8-bit ones of 16 or 32 (rows of whole "
                         f"32s), not {grid.bits}-bit ones of {grid.group}")
    out_features, in_features = grid.codes.shape
    base = five_bit_base(grid) if five_bit else None
    if base is not None:
        return _pack_five_bit(grid, base)
    if grid.bits == 8:
        codes = padded_rows(grid.codes).view(-1, PANEL, in_features // 4, 4).transpose(1, 2)
        return Int8Weight(out_features, in_features, codes.reshape(-1, in_features // 4, 4 * PANEL).contiguous(),
                          to_panels(grid.scales), to_panels(grid.offsets), 8, grid.group)
    codes = padded_rows(grid.codes).view(-1, 2, 8, in_features // 4, 4).permute(0, 3, 2, 4, 1)
    panels = codes.shape[0]
    nibbles = (codes[..., 0] | (codes[..., 1] << 4)).reshape(panels, in_features // 4, 32)
    return Int8Weight(out_features, in_features, nibbles.contiguous(), to_panels(grid.scales),
                      to_panels(grid.offsets))


def five_bit_base(grid: WeightGrid) -> int | None:
    """The base (FIVE_BIT_BASES) with every code of an 8-bit grid of 32-input groups in [base, base + 31], or None."""
    if grid.bits != 8 or grid.group != GROUP or not grid.codes.numel():
        return None
    low, high = int(grid.codes.min()), int(grid.codes.max())
    return next((base for base in FIVE_BIT_BASES if base <= low and high <= base + 31), None)


def _pack_five_bit(grid: WeightGrid, base: int) -> Int8Weight:
    out_features, in_features = grid.codes.shape
    stored = padded_rows((grid.codes.to(torch.int16) - base).to(torch.uint8))  # u in [0, 31]
    quads = in_features // 4
    low = (stored & 15).view(-1, 2, 8, quads, 4).permute(0, 3, 2, 4, 1)  # [panels, quads, 8, 4, column j | j + 8]
    panels = low.shape[0]
    nibbles = (low[..., 0] | (low[..., 1] << 4)).reshape(panels, quads, 32)
    fifth = (stored >> 4).view(panels, PANEL, quads, 4).permute(0, 2, 1, 3).reshape(panels, quads, 8, 8)
    words = (fifth << torch.arange(8, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)  # [panels, quads, 8] bytes
    groups = in_features // GROUP
    codes = torch.cat((nibbles.reshape(panels, groups, 256), words.reshape(panels, groups, 64)), dim=-1)
    return Int8Weight(out_features, in_features, codes.contiguous(), to_panels(grid.scales),
                      to_panels(grid.offsets), 5, GROUP, base)


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
        """x [rows, in] fp32 through a packed 4-, 5- or 8-bit weight."""
        x, bias, out = checked_io(x, bias, weight.in_features, weight.out_features, "int8 linear",
                                  f"{weight.bits}-bit")
        if not x.shape[0]:
            return out
        bias_ptr = 0 if bias is None else bias.data_ptr()
        codes, scales, offsets = (t.data_ptr() for t in weight.tensors())
        failed = self.coded(x.data_ptr(), codes, scales, offsets, weight.bits, weight.group, weight.base, bias_ptr,
                            out.data_ptr(), x.shape[0], weight.in_features, weight.out_features,
                            torch.get_num_threads())
        if failed == 3:
            raise ValueError(f"the C int8 linear kernel takes no {weight.bits}-bit codes in groups of {weight.group}")
        if failed:
            raise MemoryError("the C int8 linear kernel could not allocate its quantized rows")
        return out
