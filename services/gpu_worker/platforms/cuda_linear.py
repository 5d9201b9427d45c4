"""The CUDA platform's linear over weights kept quantized on the device (GPTQ / AWQ int4 as an Int4Weight, FP8 as an
FP8Weight): the weight-only Triton GEMM for steps of up to TRITON_MAX_ROWS rows (decodes: it streams the packed
bytes once), and above that F.linear over the weight dequantized for the call (a prefill's GEMM is compute-bound;
the dequantized copy lives for the call only, so the resident weights stay packed).

The weight-only kernels are imported here, when a platform binds a layer: @triton.jit reads TRITON_INTERPRET when a
kernel is defined."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedserve.kernels.weight_only_formats import FP8Weight, Int4Weight
from pagedserve.services.gpu_worker.step_rows import StepRows

# Rows up to which the Triton kernel runs, F.linear over a per-call dequantized weight above: a guess, not
# measured on a GPU (none was lent when this was written); benchmarks/device checks correctness only.
TRITON_MAX_ROWS = 32

QuantizedWeight = Int4Weight | FP8Weight


class WeightOnlyLinear:
    """y = x @ dequant(weight).T (+ bias) with `weight` packed on x's device."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None,
                 max_kernel_rows: int = TRITON_MAX_ROWS) -> None:
        from pagedserve.kernels import weight_only_linear

        self.weight, self.bias, self.max_kernel_rows = weight, bias, max_kernel_rows
        self.kernels = weight_only_linear

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        if x.shape[0] > self.max_kernel_rows:
            return F.linear(x, self.weight.dequantize(x.dtype), self.bias)
        if isinstance(self.weight, Int4Weight):
            return self.kernels.int4_linear(x, self.weight, self.bias)
        return self.kernels.fp8_linear(x, self.weight, self.bias)
