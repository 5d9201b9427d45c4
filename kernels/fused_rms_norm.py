"""RMSNorm in one kernel, optionally fused with the residual add before it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, stride_x, stride_r, stride_o, num_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row: (residual += x, rounded to the dtype, stored) then weight * norm(sum) in fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < num_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (residual.to(tl.float32) + x.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_ptr + row * stride_r + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x32 * x32, axis=0) / num_cols + eps)
    normed = (x32 * inv_rms).to(x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


def fused_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """norm(x) * weight for x [T, D] (rows may be strided, columns contiguous), a new tensor. With `residual`
    [T, D]: residual += x in place first (rounded to x's dtype), and the sum is normalised: the contract of
    pagedserve.services.gpu_worker.layers.norm.rms_norm, in one launch."""
    num_rows, num_cols = x.shape
    assert x.stride(1) == 1 and weight.shape == (num_cols,) and weight.is_contiguous()
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(1) == 1 and residual.dtype == x.dtype
    out = torch.empty((num_rows, num_cols), dtype=x.dtype, device=x.device)
    if num_rows == 0:
        return out
    block = triton.next_power_of_2(num_cols)
    _rms_norm_kernel[(num_rows,)](
        x, residual if residual is not None else x, weight, out, x.stride(0),
        residual.stride(0) if residual is not None else 0, out.stride(0), num_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=min(16, max(1, block // 256)),
    )
    return out
