"""Rotary position embeddings (Llama's non-interleaved halves) applied to q and k in place, in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_ct,
    NUM_Q_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    """One program per (token, head of q then of k): (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) in fp32."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    if head < NUM_Q_HEADS:
        base = q_ptr + token * stride_qt + head * stride_qh
    else:
        base = k_ptr + token * stride_kt + (head - NUM_Q_HEADS) * stride_kh
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    cos = tl.load(cos_ptr + token * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + token * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    x1 = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(base + offs, (x1 * cos - x2 * sin).to(base.dtype.element_ty), mask=mask)
    tl.store(base + HALF + offs, (x2 * cos + x1 * sin).to(base.dtype.element_ty), mask=mask)


def rotary_in_place(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] (strided rows and heads, contiguous last dim; views of one qkv
    tensor are fine) in place by cos, sin [T, 1, D/2] (or [T, D/2]); returns (q, k) themselves: the
    contract of pagedserve.services.gpu_worker.layers.rotary.apply_rotary, with the inputs overwritten."""
    num_tokens, num_q_heads, head_dim = q.shape
    half = head_dim // 2
    cos, sin = cos.reshape(cos.shape[0], -1), sin.reshape(sin.shape[0], -1)
    assert k.shape[0] == num_tokens and k.shape[2] == head_dim and head_dim % 2 == 0
    assert q.stride(2) == 1 and k.stride(2) == 1 and cos.shape == (num_tokens, half) and cos.stride() == sin.stride()
    assert cos.stride(1) == 1
    if num_tokens == 0:
        return q, k
    _rotary_kernel[(num_tokens, num_q_heads + k.shape[1])](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
        NUM_Q_HEADS=num_q_heads, HALF=half, BLOCK_HALF=triton.next_power_of_2(half), num_warps=1,
    )
    return q, k
