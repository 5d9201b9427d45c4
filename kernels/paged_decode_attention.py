"""Paged decode attention: one query token per request over its whole paged context, split-K (flash decoding)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.tile_dot import needs_fp32_dot, tile_dot

LOG2E = math.log2(math.e)
MIN_PARTITION = 256  # tokens; below this a split's fixed cost outweighs the parallelism it adds


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    qk_scale_log2, sliding_window, partition_size, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    SINGLE_SPLIT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr,
):
    """Program (request, kv head, split): attend the GROUP query heads of one kv head over one context slice.

    Region map of request b (positions):
        0 ...... ctx_start ...... [split_start, split_end) ...... seq_len - 1 (the query token)
        ctx_start = seq_len - sliding_window (clamped to 0) when a window is set, else 0
        split s covers [ctx_start + s * partition_size, ctx_start + (s + 1) * partition_size) ∩ [., seq_len)
    Token at position p lives at block_tables[b, p // BLOCK_SIZE], row p % BLOCK_SIZE, so a tile may span blocks.
    """
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_start = 0
    if HAS_WINDOW:
        ctx_start = tl.maximum(seq_len - sliding_window, 0)
    split_start = ctx_start + split * partition_size
    split_end = tl.minimum(split_start + partition_size, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, TILE_N)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q = tl.load(q_ptr + req * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)  # running max, log2 domain
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + req * stride_bt
    for start in range(split_start, split_end, TILE_N):
        pos = start + offs_n
        pos_mask = pos < split_end  # every tile holds >= 1 valid position, so m_i turns finite at once
        block_ids = tl.load(bt_row + pos // BLOCK_SIZE, mask=pos_mask, other=0).to(tl.int64)
        kv_offs = block_ids * stride_cb + (pos % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        kv_mask = pos_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_offs[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tile_dot(q, tl.trans(k), FP32_DOT)
        s = tl.where(pos_mask[None, :], s * qk_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tile_dot(p.to(v.dtype), v, FP32_DOT)
        m_i = m_new

    # An empty split (its slice starts past seq_len) leaves m_i = -inf, l_i = 0, acc = 0; the reduce gives it weight 0.
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if SINGLE_SPLIT:
        dst = out_ptr + req * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # part_* are contiguous: part_out [B, H, num_splits, HEAD_DIM], part_max / part_sum [B, H, num_splits].
        row = (req * (tl.num_programs(1) * GROUP) + heads) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=out_mask)
        tl.store(part_max_ptr + row, m_i, mask=g_mask)
        tl.store(part_sum_ptr + row, l_i, mask=g_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr, num_splits, stride_ot, stride_oh,
    BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (request, head): merge the per-split normalized outputs, weighted by each split's softmax mass."""
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    row = (req * tl.num_programs(1) + head) * num_splits + offs_s
    m = tl.load(part_max_ptr + row, mask=s_mask, other=float("-inf"))
    l_s = tl.load(part_sum_ptr + row, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)  # finite: split 0 always holds the query token itself
    w = tl.where(m > float("-inf"), tl.exp2(m - m_max) * l_s, 0.0)
    o = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    dst = out_ptr + req * stride_ot + head * stride_oh + offs_d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@dataclass(frozen=True)
class DecodeSplits:
    """How a decode launch cuts each context: tiles of tile_n tokens, partition_size tokens per split."""

    tile_n: int
    partition_size: int  # a multiple of tile_n
    num_splits: int  # 1 means no reduce kernel


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; 1 elsewhere (the interpreter runs programs one by one)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_partition_size(num_programs: int, visible_len: int, num_sms: int) -> int:
    """Tokens per split: enough splits to fill the device twice over, never slices shorter than MIN_PARTITION."""
    wanted = triton.cdiv(2 * num_sms, max(num_programs, 1))
    num_splits = max(1, min(wanted, triton.cdiv(visible_len, MIN_PARTITION)))
    return triton.cdiv(visible_len, num_splits)


def plan_splits(num_programs: int, head_dim: int, visible_len: int, device: torch.device,
                partition_size: int | None = None) -> DecodeSplits:
    """Split-K plan for (request, kv head) programs over contexts of at most visible_len tokens."""
    tile_n = 32 if head_dim > 128 else 64  # keeps the [tile_n, head_dim] K and V tiles in registers
    if partition_size is None:
        partition_size = choose_partition_size(num_programs, visible_len, _num_sms(device))
    tile_n = min(tile_n, max(16, triton.next_power_of_2(partition_size)))
    partition_size = triton.cdiv(partition_size, tile_n) * tile_n
    return DecodeSplits(tile_n, partition_size, triton.cdiv(visible_len, partition_size))


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_seq_len: int, *,
                           sliding_window: int | None = None, partition_size: int | None = None,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """Attend query [B, H, D] (the last token of each request) over caches [N, block_size, KVH, D]; returns [B, H, D].

    block_tables / seq_lens may hold more rows than B (only the first B are read); partition_size forces the split-K
    slice length (rounded up to the tile), otherwise it is chosen from the device size.
    """
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    assert num_heads % num_kv_heads == 0 and key_cache.shape == value_cache.shape
    assert key_cache.stride() == value_cache.stride() and key_cache.stride(3) == 1 and query.stride(2) == 1
    out = torch.empty_like(query) if out is None else out
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    visible_len = max(1, min(max_seq_len, sliding_window) if sliding_window else max_seq_len)
    plan = plan_splits(num_seqs * num_kv_heads, head_dim, visible_len, query.device, partition_size)
    block_d = max(16, triton.next_power_of_2(head_dim))
    parts = _partials(num_seqs, num_heads, plan.num_splits, head_dim, query.device)
    _decode_split_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, *parts,
        scale * LOG2E, sliding_window or 0, plan.partition_size, plan.num_splits,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        SINGLE_SPLIT=plan.num_splits == 1, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SIZE=block_size, TILE_N=plan.tile_n,
        HAS_WINDOW=bool(sliding_window), FP32_DOT=needs_fp32_dot(query.dtype, _decode_split_kernel), num_warps=4,
    )
    if plan.num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out, *parts, plan.num_splits, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(plan.num_splits), HEAD_DIM=head_dim, BLOCK_D=block_d,
        )
    return out


def _partials(num_seqs: int, num_heads: int, num_splits: int, head_dim: int,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 scratch for split-K: normalized outputs, log2-domain maxima and exp sums (one unused row when unsplit)."""
    rows = (num_seqs, num_heads, num_splits) if num_splits > 1 else (1, 1, 1)
    return (torch.empty(*rows, head_dim, dtype=torch.float32, device=device),
            torch.empty(*rows, dtype=torch.float32, device=device),
            torch.empty(*rows, dtype=torch.float32, device=device))
