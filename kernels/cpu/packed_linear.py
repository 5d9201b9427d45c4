"""The C fp32 GEMM (packed_linear.c): x [rows, in] @ weight[out, in].T (+ bias), weights packed once at load, as
fp32 panels or, when the weight is an exact grid (weight_grid.py), as the grid's codes."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.build import bind, load_kernel
from pagedserve.kernels.cpu.weight_grid import WeightGrid, find_grid

PANEL = 16  # packed_linear.c: output columns per panel
_F32_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
_CODED_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2 + [ctypes.c_int] * 4


@dataclass(frozen=True)
class PackedWeight:
    """A weight [out, in] in panels of 16 output columns: fp32 values [panels, in, 16] (bits 32), or codes
    ([panels, in, 8] uint8 nibble pairs for 4 bits, [panels, in, 16] int8 for 8) with fp32 scales and offsets
    [panels, in / group, 16] (group 32, or 16 for 8-bit codes)."""

    out_features: int
    in_features: int
    values: torch.Tensor
    scales: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    bits: int = 32
    group: int = 32

    def nbytes(self) -> int:
        extra = [t for t in (self.scales, self.offsets) if t is not None]
        return sum(t.numel() * t.element_size() for t in (self.values, *extra))


def supports(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.dtype == torch.float32 and weight.device.type == "cpu"


def pack_weight(weight: torch.Tensor | None, find_codes: bool = True, grid: WeightGrid | None = None) -> PackedWeight:
    """weight [out, in] fp32 -> panels (column 16p + j of panel p at [p, k, j], zero-padded), coded when
    `find_codes` and the weight is an exact grid (`grid`, when the caller has looked for it already or the
    checkpoint held codes: `weight` may then be None)."""
    grid = grid if grid is not None else find_grid(weight) if find_codes else None
    if grid is None:
        return PackedWeight(*weight.shape, to_panels(weight))
    codes = to_panels(grid.codes)
    if grid.bits == 4:
        codes = codes[..., :PANEL // 2] | (codes[..., PANEL // 2:] << 4)
    return PackedWeight(*grid.codes.shape, codes.contiguous(), to_panels(grid.scales), to_panels(grid.offsets),
                        grid.bits, grid.group)


def padded_rows(matrix: torch.Tensor) -> torch.Tensor:
    """[out, n] -> [16 * ceil(out / 16), n]: zero rows up to whole panels."""
    padded = torch.zeros(-(-matrix.shape[0] // PANEL) * PANEL, matrix.shape[1], dtype=matrix.dtype)
    padded[: matrix.shape[0]] = matrix
    return padded


def to_panels(matrix: torch.Tensor) -> torch.Tensor:
    """[out, n] -> [ceil(out / 16), n, 16], zero-padded past the last row."""
    padded = padded_rows(matrix)
    return padded.view(-1, PANEL, matrix.shape[1]).transpose(1, 2).contiguous()


def checked_io(x: torch.Tensor, bias: torch.Tensor | None, in_features: int, out_features: int, kernel: str,
               weight_kind: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The C GEMMs' inputs made contiguous, and their output [rows, out]; ValueError when they do not fit."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[1] != in_features:
        raise ValueError(f"no C {kernel} for {tuple(x.shape)} {x.dtype} x a {weight_kind} "
                         f"[{out_features}, {in_features}] weight")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (out_features,)):
        raise ValueError(f"bias {tuple(bias.shape)} {bias.dtype} does not fit {out_features} fp32 outputs")
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    return x.contiguous(), None if bias is None else bias.contiguous(), out


class PackedLinear:
    def __init__(self) -> None:
        library = load_kernel("packed_linear")
        self.f32 = bind(library, "packed_linear_f32", _F32_ARGTYPES)
        self.coded = bind(library, "packed_linear_coded", _CODED_ARGTYPES)

    def __call__(self, x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] fp32 through a packed weight."""
        x, bias, out = checked_io(x, bias, weight.in_features, weight.out_features, "packed linear", "packed")
        bias_ptr = 0 if bias is None else bias.data_ptr()
        if not x.shape[0]:
            return out
        sizes = (x.shape[0], weight.in_features, weight.out_features, torch.get_num_threads())
        if weight.bits == 32:
            self.f32(x.data_ptr(), weight.values.data_ptr(), bias_ptr, out.data_ptr(), *sizes)
        else:
            self.coded(x.data_ptr(), weight.values.data_ptr(), weight.scales.data_ptr(), weight.offsets.data_ptr(),
                       weight.bits, weight.group, bias_ptr, out.data_ptr(), *sizes)
        return out
