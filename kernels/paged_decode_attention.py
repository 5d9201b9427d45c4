"""Paged decode attention: one query token per request over its whole paged context, split-K (flash decoding).

Capture-safe: the launch grid and every scalar argument depend only on static facts (batch rows, KV heads, the SM
count and the block table's width), never on a step's lengths. Each program finds its own slice of its request's
context from `seq_lens` inside the kernel; a split past the end of a short context loads nothing. The split-K
partial buffers come from a DecodeWorkspace the caller allocates once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pagedserve.kernels.tile_dot import needs_fp32_dot, tile_dot

LOG2E = math.log2(math.e)
MIN_PARTITION = 256  # tokens; below this a split's fixed cost outweighs the parallelism it adds


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_max_ptr, part_sum_ptr,
    qk_scale_log2, v_scale, sliding_window, partition_size, num_splits, min_partition,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch, stride_bt,
    SINGLE_SPLIT: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr, KV_FP8: tl.constexpr,
):
    """Program (request, kv head, split): attend the GROUP query heads of one kv head over one context slice.

    Region map of request b (positions):
        0 ...... ctx_start ...... [split_start, split_end) ...... seq_len - 1 (the query token)
        ctx_start = seq_len - sliding_window (clamped to 0) when a window is set, else 0
        split s covers [ctx_start + s * part, ctx_start + (s + 1) * part) ∩ [., seq_len)
        part = partition_size when > 0 (forced), else the request's own: its visible length cut into
        min(num_splits, cdiv(visible, min_partition)) slices, rounded up to TILE_N
    Token at position p lives at block_tables[b, p // BLOCK_SIZE], row p % BLOCK_SIZE, so a tile may span blocks.
    A split that starts past seq_len runs no loop iteration (no loads) and stores weight 0 for the reduce.
    KV_FP8: K and V tiles are e4m3, converted exactly to the query's dtype; the key scale is folded into
    qk_scale_log2 and the value scale multiplies the output (both are per-layer constants).
    """
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_start = 0
    if HAS_WINDOW:
        ctx_start = tl.maximum(seq_len - sliding_window, 0)
    part = partition_size
    if partition_size == 0:
        visible = seq_len - ctx_start
        used = tl.maximum(tl.minimum(num_splits, tl.cdiv(visible, min_partition)), 1)
        part = tl.cdiv(tl.cdiv(visible, used), TILE_N) * TILE_N
    split_start = ctx_start + split * part
    split_end = tl.minimum(split_start + part, seq_len)

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
        if KV_FP8:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
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
    if KV_FP8:
        out = out * v_scale
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
    out = tl.sum(tl.where(w[:, None] > 0, w[:, None] * o, 0.0), 0) / tl.sum(w, 0)
    dst = out_ptr + req * stride_ot + head * stride_oh + offs_d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@dataclass(frozen=True)
class DecodeSplits:
    """How a decode launch cuts each context: tiles of tile_n tokens, at most num_splits splits a request.

    partition_size 0: each request cuts its own visible length in the kernel (the capture-safe default); > 0: every
    request uses slices of that many tokens (a forced size, for tests and tuning)."""

    tile_n: int
    partition_size: int  # a multiple of tile_n, or 0
    num_splits: int  # 1 means no reduce kernel


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; 1 elsewhere (the interpreter runs programs one by one)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(num_programs: int, max_len: int, num_sms: int) -> int:
    """Splits a request: enough to fill the device twice over, never more than slices of MIN_PARTITION tokens of the
    longest context the block table can address (`max_len`, a static bound, not a step's lengths)."""
    wanted = triton.cdiv(2 * num_sms, max(num_programs, 1))
    return max(1, min(wanted, triton.cdiv(max_len, MIN_PARTITION)))


def plan_splits(num_programs: int, head_dim: int, max_len: int, device: torch.device,
                partition_size: int | None = None, num_sms: int | None = None) -> DecodeSplits:
    """Split-K plan for (request, kv head) programs over contexts of at most max_len visible tokens."""
    tile_n = 32 if head_dim > 128 else 64  # keeps the [tile_n, head_dim] K and V tiles in registers
    if partition_size is None:
        num_splits = choose_num_splits(num_programs, max_len, num_sms or _num_sms(device))
        tile_n = min(tile_n, max(16, triton.next_power_of_2(triton.cdiv(max_len, num_splits))))
        return DecodeSplits(tile_n, 0, num_splits)
    tile_n = min(tile_n, max(16, triton.next_power_of_2(partition_size)))
    partition_size = triton.cdiv(partition_size, tile_n) * tile_n
    return DecodeSplits(tile_n, partition_size, triton.cdiv(max_len, partition_size))


@dataclass
class DecodeWorkspace:
    """fp32 scratch for split-K, allocated once and reused by every launch (a captured graph keeps its addresses):
    normalized outputs, log2-domain maxima and exp sums, `capacity` (request, head, split) rows each."""

    part_out: torch.Tensor  # [capacity * head_dim]
    part_max: torch.Tensor  # [capacity]
    part_sum: torch.Tensor  # [capacity]

    @classmethod
    def allocate(cls, capacity: int, head_dim: int, device: torch.device) -> DecodeWorkspace:
        capacity = max(capacity, 1)
        return cls(torch.empty(capacity * head_dim, dtype=torch.float32, device=device),
                   torch.empty(capacity, dtype=torch.float32, device=device),
                   torch.empty(capacity, dtype=torch.float32, device=device))

    @property
    def capacity(self) -> int:
        return self.part_max.numel()

    def views(self, num_rows: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if num_rows > self.capacity or self.part_out.numel() < num_rows * head_dim:
            raise ValueError(f"the decode workspace holds {self.capacity} rows, the launch needs {num_rows}")
        return self.part_out[: num_rows * head_dim], self.part_max[:num_rows], self.part_sum[:num_rows]


def workspace_rows(num_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int, max_len: int,
                   device: torch.device, num_sms: int | None = None) -> int:
    """The workspace rows a launch of num_seqs requests needs (0 when it runs unsplit)."""
    plan = plan_splits(num_seqs * num_kv_heads, head_dim, max_len, device, num_sms=num_sms)
    return num_seqs * num_heads * plan.num_splits if plan.num_splits > 1 else 0


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_seq_len: int, *,
                           sliding_window: int | None = None, partition_size: int | None = None,
                           out: torch.Tensor | None = None, workspace: DecodeWorkspace | None = None,
                           num_sms: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Attend query [B, H, D] (the last token of each request) over caches [N, block_size, KVH, D]; returns [B, H, D].

    `max_seq_len` bounds every request's context (pass a static bound, e.g. the block table's width x block size,
    so that the launch does not depend on the step); block_tables / seq_lens may hold more rows than B (only the
    first B are read); partition_size forces the split-K slice length (rounded up to the tile), otherwise each
    request cuts its own context into at most the planned number of splits. Without a `workspace` the partials are
    allocated for this call; `num_sms` overrides the device's SM count (tests). A float8_e4m3fn cache holds
    key / k_scale and value / v_scale (cache_write); other caches ignore the scales.
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
    plan = plan_splits(num_seqs * num_kv_heads, head_dim, visible_len, query.device, partition_size, num_sms)
    block_d = max(16, triton.next_power_of_2(head_dim))
    num_rows = num_seqs * num_heads * plan.num_splits if plan.num_splits > 1 else 1
    if workspace is None:
        workspace = DecodeWorkspace.allocate(num_rows, head_dim, query.device)
    parts = workspace.views(num_rows, head_dim)
    kv_fp8 = key_cache.dtype == torch.float8_e4m3fn
    k_scale, v_scale = (k_scale, v_scale) if kv_fp8 else (1.0, 1.0)
    _decode_split_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
        query, key_cache, value_cache, block_tables, seq_lens, out, *parts,
        scale * k_scale * LOG2E, v_scale, sliding_window or 0, plan.partition_size, plan.num_splits, MIN_PARTITION,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), block_tables.stride(0),
        SINGLE_SPLIT=plan.num_splits == 1, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_SIZE=block_size, TILE_N=plan.tile_n,
        HAS_WINDOW=bool(sliding_window), FP32_DOT=needs_fp32_dot(query.dtype, _decode_split_kernel), KV_FP8=kv_fp8,
        num_warps=4,
    )
    if plan.num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out, *parts, plan.num_splits, out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(plan.num_splits), HEAD_DIM=head_dim, BLOCK_D=block_d,
        )
    return out
