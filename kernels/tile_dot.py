"""The one tile matmul the attention kernels use, and the rule for when it must run in fp32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def tile_dot(a, b, FP32_DOT: tl.constexpr):
    """a @ b accumulated in fp32; FP32_DOT upcasts both operands and forbids TF32 truncation."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


def needs_fp32_dot(dtype: torch.dtype, kernel: object) -> bool:
    """fp32 inputs keep full precision (no TF32); the interpreter's dot mistakes bf16 bits for integers."""
    interpreted = isinstance(kernel, InterpretedFunction)
    return dtype == torch.float32 or (interpreted and dtype == torch.bfloat16)

