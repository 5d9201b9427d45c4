"""Paged attention in plain torch, for CPU: block-level gathers and scaled_dot_product_attention.

Decodes (one query each) run as one batched call over contexts padded to the longest; each prefill chunk runs
as its own call (a step holds few of them, and padding a long chunk against many decodes would cost more).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.attention.metadata import AttentionMetadata


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        keep = slot_mapping >= 0
        if not bool(keep.all()):
            key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
        num_kv_heads, head_dim = key_cache.shape[2], key_cache.shape[3]
        key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
        value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        out = torch.empty_like(query)
        if meta.num_decodes:
            out[: meta.num_decodes] = self._decode(query[: meta.num_decodes], key_cache, value_cache, meta)
        starts = meta.query_start_loc_cpu
        for i in range(meta.num_decodes, meta.num_requests):
            q = query[starts[i]: starts[i + 1]]
            out[starts[i]: starts[i + 1]] = self._prefill(q, key_cache, value_cache, meta, i)
        return out

    def _decode(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """query [B, H, D] -> [B, H, D]; every request's single query is its last position."""
        num = meta.num_decodes
        seq_lens = meta.seq_lens[:num].long()
        max_len = max(meta.seq_lens_cpu[:num])
        keys, values = _gather_context(key_cache, value_cache, meta.block_tables[:num], max_len)
        key_pos = torch.arange(max_len, device=query.device)
        mask = key_pos[None, :] < seq_lens[:, None]
        if self.shape.sliding_window is not None:
            mask &= key_pos[None, :] > (seq_lens[:, None] - 1 - self.shape.sliding_window)
        out = F.scaled_dot_product_attention(
            query.unsqueeze(2), keys, values, attn_mask=_additive(mask[:, None, None, :], query.dtype),
            scale=self.shape.scale, enable_gqa=self.shape.num_heads != self.shape.num_kv_heads)
        return out.squeeze(2)

    def _prefill(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 meta: AttentionMetadata, i: int) -> torch.Tensor:
        """query [q_len, H, D] of request i, whose tokens are the last q_len of its seq_len positions."""
        seq_len, q_len = meta.seq_lens_cpu[i], query.shape[0]
        keys, values = _gather_context(key_cache, value_cache, meta.block_tables[i: i + 1], seq_len)
        gqa = self.shape.num_heads != self.shape.num_kv_heads
        q = query.transpose(0, 1).unsqueeze(0)
        if seq_len == q_len and self.shape.sliding_window is None:  # nothing cached before the chunk: plain causal
            out = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=self.shape.scale,
                                                 enable_gqa=gqa)
            return out.squeeze(0).transpose(0, 1)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        k_pos = torch.arange(seq_len, device=query.device)
        mask = k_pos[None, :] <= q_pos[:, None]
        if self.shape.sliding_window is not None:
            mask &= k_pos[None, :] > (q_pos[:, None] - self.shape.sliding_window)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=_additive(mask, query.dtype),
                                             scale=self.shape.scale, enable_gqa=gqa)
        return out.squeeze(0).transpose(0, 1)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean keep-mask -> 0 / -inf additive mask: torch's CPU attention runs about twice as fast with it."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def _gather_context(key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                    length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole blocks of each request's context -> keys, values [B, Hkv, length, D] (rows past a request's end are
    other blocks' data or padding: callers mask them)."""
    block_size = key_cache.shape[1]
    num_blocks = -(-length // block_size)
    table = block_tables[:, :num_blocks].long()
    batch = table.shape[0]
    keys = key_cache[table].view(batch, num_blocks * block_size, *key_cache.shape[2:])[:, :length]
    values = value_cache[table].view(batch, num_blocks * block_size, *value_cache.shape[2:])[:, :length]
    return keys.transpose(1, 2), values.transpose(1, 2)
