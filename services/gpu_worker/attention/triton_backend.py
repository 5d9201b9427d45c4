"""Attention through the Triton kernels in kernels/: paged decode for the decodes, paged prefill for the rest."""

from __future__ import annotations

import torch

from kernels.cache_write import cache_write
from kernels.paged_decode_attention import paged_decode_attention
from kernels.paged_prefill_attention import paged_prefill_attention
from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    """Runs on CUDA, or on CPU when the kernels were imported with TRITON_INTERPRET=1 (slow; for tests)."""

    name = "triton"

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Store key/value rows [T, num_kv_heads, head_dim] at their slots; a negative slot is skipped."""
        cache_write(key, value, key_cache, value_cache, slot_mapping)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        """Causal attention of query rows [T, num_heads, head_dim]; rows past query_start_loc[-1] stay unset."""
        out = torch.empty_like(query)
        num_decodes = meta.num_decodes
        window = self.shape.sliding_window
        if num_decodes > 0:
            # Decodes come first with one row each, so request i's query row is row i.
            paged_decode_attention(
                query[:num_decodes], key_cache, value_cache, meta.block_tables, meta.seq_lens, self.shape.scale,
                max(meta.seq_lens_cpu[:num_decodes]), sliding_window=window, out=out[:num_decodes],
            )
        num_prefills = meta.num_requests - num_decodes
        if num_prefills > 0:
            paged_prefill_attention(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                self.shape.scale, meta.max_query_len, first_req=num_decodes, num_reqs=num_prefills,
                sliding_window=window, out=out,
            )
        return out
