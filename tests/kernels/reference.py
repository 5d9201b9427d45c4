"""Plain torch references for the paged kernels: Python loops over requests, no cleverness."""

from __future__ import annotations

import torch


def gather_context(cache: torch.Tensor, block_table: list[int], seq_len: int) -> torch.Tensor:
    """Rows [seq_len, num_kv_heads, head_dim] of one request, read position by position through its block table."""
    block_size = cache.shape[1]
    rows = [cache[block_table[pos // block_size], pos % block_size] for pos in range(seq_len)]
    return torch.stack(rows)


def attend_one(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
               sliding_window: int | None) -> torch.Tensor:
    """Causal fp32 attention of query [q_len, H, D] whose tokens are the last q_len of keys/values [S, KVH, D]."""
    q_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    k = keys.float().repeat_interleave(group, dim=1)  # query head h reads kv head h // group
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * scale
    q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
    k_pos = torch.arange(seq_len)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= k_pos > q_pos - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def paged_attention_ref(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: list[int], query_start_loc: list[int], scale: float,
                        sliding_window: int | None = None) -> torch.Tensor:
    """fp32 output [T, H, D]: request i's query rows [qsl[i], qsl[i+1]) attend over its paged context."""
    out = torch.zeros(query.shape, dtype=torch.float32)
    for i, seq_len in enumerate(seq_lens):
        rows = slice(query_start_loc[i], query_start_loc[i + 1])
        table = block_tables[i].tolist()
        keys = gather_context(key_cache.cpu(), table, seq_len)
        values = gather_context(value_cache.cpu(), table, seq_len)
        out[rows] = attend_one(query[rows].cpu(), keys, values, scale, sliding_window)
    return out


def cache_write_ref(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    slot_mapping: list[int]) -> None:
    """Store row t of key/value at slot_mapping[t], skipping negative slots."""
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[t]
            value_cache[slot // block_size, slot % block_size] = value[t]
