"""The C fp32 GEMM (packed_linear.c): x [rows, in] @ weight[out, in].T (+ bias), weights packed once at load."""

from __future__ import annotations

import ctypes

import torch

from kernels.cpu.build import bind, load_kernel

PANEL = 16  # packed_linear.c: output columns per panel
_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4


def supports(weight: torch.Tensor) -> bool:
    return weight.dim() == 2 and weight.dtype == torch.float32 and weight.device.type == "cpu"


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] -> panels [ceil(out / 16), in, 16]: column 16p + j of panel p at [p, k, j], zero-padded."""
    out_features, in_features = weight.shape
    panels = -(-out_features // PANEL)
    padded = torch.zeros(panels * PANEL, in_features, dtype=weight.dtype)
    padded[:out_features] = weight
    return padded.view(panels, PANEL, in_features).transpose(1, 2).contiguous()


class PackedLinear:
    def __init__(self) -> None:
        self.entry = bind(load_kernel("packed_linear"), "packed_linear_f32", _ARGTYPES)

    def __call__(self, x: torch.Tensor, packed: torch.Tensor, out_features: int,
                 bias: torch.Tensor | None) -> torch.Tensor:
        """x [rows, in] fp32 through the packed weight of a layer with `out_features` outputs."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[1] != packed.shape[1]:
            raise ValueError(f"no C packed linear for {tuple(x.shape)} {x.dtype} x packed {tuple(packed.shape)}")
        if bias is not None and (bias.dtype != torch.float32 or bias.shape != (out_features,)):
            raise ValueError(f"bias {tuple(bias.shape)} {bias.dtype} does not fit {out_features} fp32 outputs")
        x = x.contiguous()
        bias = None if bias is None else bias.contiguous()
        out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
        if x.shape[0]:
            self.entry(x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), out.data_ptr(),
                       x.shape[0], x.shape[1], out_features, torch.get_num_threads())
        return out
