"""The C fused elementwise steps (fused_ops.c): RMSNorm (optionally after the residual add), SiLU-and-multiply and
rotary embeddings, on contiguous CPU tensors of bf16 or fp32 whose widths are multiples of 16."""

from __future__ import annotations

import ctypes

import torch

from pagedserve.kernels.cpu.build import ELEMENT_TYPES, bind, load_kernel

LANES = 16  # widths must be multiples of this (fused_ops.c)


def supports(x: torch.Tensor, width: int) -> bool:
    return x.dtype in ELEMENT_TYPES and x.device.type == "cpu" and width % LANES == 0


class FusedOps:
    def __init__(self) -> None:
        library = load_kernel("fused_ops")
        ptr, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        signatures = {"rms_norm": [ptr] * 4 + [i, i, f, i], "silu_mul": [ptr, ptr, i, i, i],
                      "rotary": [ptr, ctypes.c_int64, ptr, ptr, i, i, i, i]}
        self.entries = {(op, dtype): bind(library, f"{op}_{name}", argtypes, restype=None)
                        for op, argtypes in signatures.items() for dtype, name in ELEMENT_TYPES.items()}

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of x [T, D]; with `residual`, first residual += x (in place) and normalise that sum."""
        x = x.contiguous()
        out = torch.empty_like(x)
        if residual is not None and not residual.is_contiguous():
            raise ValueError("the residual must be contiguous (it is updated in place)")
        self.entries["rms_norm", x.dtype](x.data_ptr(), 0 if residual is None else residual.data_ptr(),
                                          weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[-1], eps,
                                          torch.get_num_threads())
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up [T, 2W] -> silu(gate) * up [T, W]."""
        gate_up = gate_up.contiguous()
        width = gate_up.shape[1] // 2
        out = torch.empty(gate_up.shape[0], width, dtype=gate_up.dtype)
        self.entries["silu_mul", gate_up.dtype](gate_up.data_ptr(), out.data_ptr(), gate_up.shape[0], width,
                                                torch.get_num_threads())
        return out

    def rotary_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate x [T, H, D] in place; its heads contiguous, rows any stride apart; cos/sin [T, 1, D/2]."""
        rows, heads, dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != dim:
            raise ValueError("rotary_ needs each row's heads contiguous")
        cos, sin = cos.contiguous(), sin.contiguous()
        self.entries["rotary", x.dtype](x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), rows, heads, dim,
                                        torch.get_num_threads())
