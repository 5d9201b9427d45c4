"""RMSNorm, computed in fp32 like the reference implementation; optionally fused with the residual add."""

from __future__ import annotations

from collections.abc import Callable

import torch

# (x [T, D], weight [D], eps, residual [T, D] or None) -> norm(x), after residual += x in place when given
NormKernel = Callable[[torch.Tensor, torch.Tensor, float, "torch.Tensor | None"], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
             ) -> torch.Tensor:
    """The portable kernel: with `residual`, residual += x (in place) first and the sum is normalised."""
    if residual is not None:
        x = residual.add_(x)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.kernel: NormKernel = rms_norm  # a platform may bind a fused one at load

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """norm(x) of x [T, size]; with `residual`: residual += x in place first, and the sum is normalised."""
        return self.kernel(x, self.weight, self.eps, residual)
