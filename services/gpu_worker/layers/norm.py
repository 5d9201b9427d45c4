"""RMSNorm, computed in fp32 like the reference implementation; optionally fused with the residual add."""

from __future__ import annotations

import torch

from kernels.cpu.fused_ops import FusedOps, supports


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.fused: FusedOps | None = None  # the C kernels on CPU (DecoderLM.use_fused_ops)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """norm(x); with `residual`: residual += x in place first, and the sum is normalised."""
        if self.fused is not None and supports(x, x.shape[-1]) and x.dim() == 2:
            return self.fused.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = residual.add_(x)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)
