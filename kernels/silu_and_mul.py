"""The gated MLP's activation, silu(gate) * up, in one kernel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, width, BLOCK: tl.constexpr):
    """One program per (row, BLOCK columns of the output), computed in fp32."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    gate = tl.load(gate_up_ptr + row * stride_in + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + width + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def fused_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2W] (gate then up, contiguous last dim) -> silu(gate) * up [T, W], a new tensor."""
    num_rows, double_width = gate_up.shape
    width = double_width // 2
    assert gate_up.stride(1) == 1 and double_width % 2 == 0
    out = torch.empty((num_rows, width), dtype=gate_up.dtype, device=gate_up.device)
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(width))
    _silu_and_mul_kernel[(num_rows, triton.cdiv(width, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), width, BLOCK=block, num_warps=4,
    )
    return out
