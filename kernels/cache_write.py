"""Scatter a step's new key/value rows into their paged-cache slots.

A float8_e4m3fn cache stores each element as e4m3(value / scale), saturated to +-448, with one scale for the keys
and one for the values of a layer (kernels/fp8_e4m3.py gives the exact rounding); other caches store the value
converted to their dtype and take no scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedserve.kernels.fp8_e4m3 import encode_e4m3


@triton.jit
def _cache_write_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, k_scale, v_scale,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr,
):
    """One program per (token, kv head): copy one head_dim row of K and of V to slot_mapping[token].

    FP8: the cache pointers are uint8 views of e4m3 caches; rows are divided by their scale and encoded."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    # A negative slot means "do not store" (padding or a token whose block is already cached): an empty row mask.
    mask = offs_d < tl.where(slot >= 0, HEAD_DIM, 0)
    block_id = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    src_k = key_ptr + token * stride_kt + head * stride_kh + offs_d
    src_v = value_ptr + token * stride_vt + head * stride_vh + offs_d
    dst = block_id * stride_cb + offset * stride_cs + head * stride_ch + offs_d
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if FP8:
        tl.store(key_cache_ptr + dst, encode_e4m3(tl.math.div_rn(k.to(tl.float32), k_scale)), mask=mask)
        tl.store(value_cache_ptr + dst, encode_e4m3(tl.math.div_rn(v.to(tl.float32), v_scale)), mask=mask)
    else:
        tl.store(key_cache_ptr + dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(value_cache_ptr + dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def cache_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Store key/value [T, num_kv_heads, head_dim] into caches [num_blocks, block_size, num_kv_heads, head_dim];
    `k_scale`/`v_scale` divide the rows of a float8_e4m3fn cache (ignored by other dtypes)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape and slot_mapping.shape[0] >= num_tokens
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == (num_kv_heads, head_dim) and key_cache.stride(3) == 1
    assert key.stride(2) == 1 and value.stride(2) == 1
    if num_tokens == 0:
        return
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    if fp8:
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
    _cache_write_kernel[(num_tokens, num_kv_heads)](
        key, value, key_cache, value_cache, slot_mapping, float(k_scale), float(v_scale),
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), FP8=fp8,
    )
