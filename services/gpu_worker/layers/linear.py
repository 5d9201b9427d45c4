"""The linear layer: it owns its weight and bias and calls the kernel its device's platform bound at load."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from pagedserve.services.gpu_worker.step_rows import StepRows

if TYPE_CHECKING:
    from pagedserve.kernels.cpu.weight_grid import WeightGrid
    from pagedserve.kernels.weight_only_formats import FP8Weight

Product = Callable[[torch.Tensor], torch.Tensor]  # x [rows, in] -> x @ weight.T (+ bias), for one bound weight


class LinearKernel(Protocol):
    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """x [rows, in] -> [rows, out]; `rows` says which rows of x are decodes."""


class Linear(torch.nn.Module):
    """y = x @ weight.T (+ bias) through `kernel`, bound by the platform once the weights are loaded. A GGUF
    checkpoint's quantized weight comes as `grid` instead (weight stays on the meta device) for a platform that
    takes grids (Platform.takes_weight_grids / takes_linear_grid), an FP8 checkpoint's as `fp8` for a platform
    that keeps them (Platform.keeps_fp8_weights); binding drops them."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device="meta"),
                                         requires_grad=False)
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype, device="meta"),
                                       requires_grad=False) if bias else None
        self.grid: WeightGrid | None = None
        self.fp8: FP8Weight | None = None
        self.kernel: LinearKernel = _unbound

    def forward(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return self.kernel(x, rows)


def _unbound(x: torch.Tensor, rows: StepRows) -> torch.Tensor:
    raise RuntimeError("a Linear ran before its platform bound a kernel to it (Platform.bind_layers)")


def at_least_two_rows(product: Product) -> Product:
    """`product`, with a lone row computed as two: oneDNN multiplies a single row another way (its K-split gemv
    gives some outputs other last bits), and as two rows the row gets the numbers it gets among any others."""

    def call(x: torch.Tensor) -> torch.Tensor:
        return product(x.repeat(2, 1))[:1] if x.shape[0] == 1 else product(x)

    return call


class TorchLinear:
    """The portable kernel: F.linear for every row (a lone row as two), whatever the step holds."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.product = at_least_two_rows(lambda x: F.linear(x, weight, bias))

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return self.product(x)


class PlainLinear:
    """F.linear for every row, a lone row included: for devices whose one-row product needs no workaround (CUDA:
    one launch, a GEMV, instead of at_least_two_rows' repeat, two-row GEMM and slice)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
