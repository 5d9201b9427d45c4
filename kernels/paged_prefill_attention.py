"""Paged prefill attention: each request's chunk of query tokens attends causally to its whole paged context."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pagedserve.kernels.tile_dot import needs_fp32_dot, tile_dot

LOG2E = math.log2(math.e)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    first_req, qk_scale_log2, v_scale, sliding_window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr, KV_FP8: tl.constexpr,
):
    """Program (request, query tile, kv head): BLOCK_Q chunk tokens x GROUP query heads, online softmax over the cache.

    Region map of request `req` (positions; the chunk's keys are already written to the cache):
        0 .............. ctx_len .............. seq_len
        [ cached prefix  ][ this step's chunk  ]      chunk token j is at position ctx_len + j
    Tile row r -> chunk token q_tile * BLOCK_Q + r // GROUP, query head kv_head * GROUP + r % GROUP;
    rows r >= BLOCK_Q * GROUP belong to no token (BLOCK_M is a power of two, GROUP need not be).
    Keys visited: [kv_start, kv_end) with kv_end one past the tile's last query position (causal bound).
    KV_FP8: K and V tiles are e4m3, converted exactly to the query's dtype; the key scale is folded into
    qk_scale_log2 and the value scale multiplies the output.
    """
    req = first_req + tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:
        return  # the grid is sized for the longest chunk in the batch
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, TILE_N)
    tok = q_tile * BLOCK_Q + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_mask = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    d_mask = offs_d < HEAD_DIM
    q_pos = ctx_len + tok
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)

    kv_end = ctx_len + tl.minimum(q_len, (q_tile + 1) * BLOCK_Q)
    kv_start = 0
    if HAS_WINDOW:
        kv_start = tl.maximum(ctx_len + q_tile * BLOCK_Q - sliding_window + 1, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max, log2 domain
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + req * stride_bt
    for start in range(kv_start, kv_end, TILE_N):
        pos = start + offs_n
        pos_mask = pos < kv_end
        block_ids = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        kv_offs = block_ids * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        s = tile_dot(q, tl.trans(k), FP32_DOT)
        visible = pos_mask[None, :] & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row may see nothing yet (a padding row under a window, or BLOCK_Q > TILE_N): keep its max finite so
        # exp2 gives 0 rather than NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tile_dot(p.to(v.dtype), v, FP32_DOT)
        m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if KV_FP8:
        out = out * v_scale
    dst = out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                            scale: float, max_query_len: int, *, first_req: int = 0, num_reqs: int | None = None,
                            sliding_window: int | None = None, out: torch.Tensor | None = None,
                            k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Causal attention of query rows [T, H, D] for requests [first_req, first_req + num_reqs); returns [T, H, D].

    query_start_loc indexes rows of `query`/`out` directly, so a batch's decodes can sit before the prefills
    untouched; rows of other requests are left as they are in `out`. A float8_e4m3fn cache holds key / k_scale and
    value / v_scale (cache_write); other caches ignore the scales.
    """
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert num_heads % num_kv_heads == 0 and key_cache.shape == value_cache.shape
    assert key_cache.stride() == value_cache.stride() and key_cache.stride(3) == 1 and query.stride(2) == 1
    out = torch.empty_like(query) if out is None else out
    num_reqs = query_start_loc.shape[0] - 1 - first_req if num_reqs is None else num_reqs
    if num_reqs == 0 or max_query_len == 0:
        return out
    group = num_heads // num_kv_heads
    block_m = max(64, triton.next_power_of_2(group))
    block_q = block_m // group
    kv_fp8 = key_cache.dtype == torch.float8_e4m3fn
    k_scale, v_scale = (k_scale, v_scale) if kv_fp8 else (1.0, 1.0)
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        query, key_cache, value_cache, out, block_tables, seq_lens, query_start_loc,
        first_req, scale * k_scale * LOG2E, v_scale, sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        GROUP=group, BLOCK_M=block_m, BLOCK_Q=block_q, HEAD_DIM=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size,
        TILE_N=32 if head_dim > 128 else 64, HAS_WINDOW=bool(sliding_window),
        FP32_DOT=needs_fp32_dot(query.dtype, _prefill_kernel), KV_FP8=kv_fp8, num_warps=8 if head_dim > 128 else 4,
    )
    return out
