"""The C few-row linear layer (small_linear.c): x [rows <= 8, in] @ weight[out, in].T (+ bias) on CPU tensors."""

from __future__ import annotations

import ctypes

import torch

from pagedserve.kernels.cpu.build import ELEMENT_TYPES, bind, load_kernel

MAX_ROWS = 8  # small_linear.c
_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.dtype == weight.dtype and x.dtype in ELEMENT_TYPES
            and x.device.type == "cpu" and weight.device.type == "cpu" and weight.is_contiguous())


class SmallLinear:
    def __init__(self) -> None:
        library = load_kernel("small_linear")
        self.entries = {dtype: bind(library, f"small_linear_{name}", _ARGTYPES)
                        for dtype, name in ELEMENT_TYPES.items()}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not supports(x, weight) or (bias is not None and bias.dtype != x.dtype):
            raise ValueError(f"no C small-row kernel for {tuple(x.shape)} {x.dtype} x {weight.dtype} weights")
        x = x.contiguous()
        bias = None if bias is None else bias.contiguous()
        rows, in_features = x.shape
        out = torch.empty(rows, weight.shape[0], dtype=x.dtype)
        failed = self.entries[x.dtype](x.data_ptr(), weight.data_ptr(), 0 if bias is None else bias.data_ptr(),
                                       out.data_ptr(), rows, in_features, weight.shape[0], torch.get_num_threads())
        if failed:
            raise MemoryError("the C small-row kernel could not allocate its scratch")
        return out
