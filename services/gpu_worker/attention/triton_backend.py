"""Attention through the Triton kernels in kernels/: paged decode for the decodes, paged prefill for the rest.

The decode launch is capture-safe: its grid and scalars come from the batch's row count, the KV heads, the SM count
and the block table's width (a static bound on every context), never from a step's lengths read on the host; its
split-K partials live in one workspace that grows only outside a captured region (`reserve_decode`).
"""

from __future__ import annotations

import torch

from pagedserve.kernels.cache_write import cache_write
from pagedserve.kernels.paged_decode_attention import DecodeWorkspace, paged_decode_attention, workspace_rows
from pagedserve.kernels.paged_prefill_attention import paged_prefill_attention
from pagedserve.services.gpu_worker.attention.backend import UNIT_SCALES, AttentionBackend, AttentionShape, KVScales
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata


class TritonAttentionBackend(AttentionBackend):
    """Runs on CUDA, or on CPU when the kernels were imported with TRITON_INTERPRET=1 (slow; for tests)."""

    name = "triton"

    def __init__(self, shape: AttentionShape, num_sms: int | None = None) -> None:
        """`num_sms` overrides the device's SM count in the split plan (tests: several splits on CPU)."""
        super().__init__(shape)
        self.num_sms = num_sms
        self.workspace: DecodeWorkspace | None = None

    def reserve_decode(self, num_seqs: int, max_len: int, device: torch.device) -> None:
        """Make the split-K workspace big enough for decodes of up to num_seqs requests over contexts of at most
        max_len tokens (call before capturing a graph: the workspace must not move inside one)."""
        s = self.shape
        rows = workspace_rows(num_seqs, s.num_heads, s.num_kv_heads, s.head_dim, self._visible(max_len), device,
                              self.num_sms)
        if self.workspace is None or self.workspace.capacity < rows:
            self.workspace = DecodeWorkspace.allocate(rows, s.head_dim, device)

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, scales: KVScales = UNIT_SCALES) -> None:
        """Store key/value rows [T, num_kv_heads, head_dim] at their slots; a negative slot is skipped."""
        cache_write(key, value, key_cache, value_cache, slot_mapping, scales.k_scale, scales.v_scale)

    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata, scales: KVScales = UNIT_SCALES) -> torch.Tensor:
        """Causal attention of query rows [T, num_heads, head_dim]; rows past query_start_loc[-1] stay unset."""
        out = torch.empty_like(query)
        num_decodes = meta.num_decodes
        window = self.shape.sliding_window
        if num_decodes > 0:
            # Decodes come first with one row each, so request i's query row is row i.
            max_len = meta.block_tables.shape[1] * key_cache.shape[1]  # static: no host read of seq_lens
            self.reserve_decode(num_decodes, max_len, query.device)
            paged_decode_attention(
                query[:num_decodes], key_cache, value_cache, meta.block_tables, meta.seq_lens, self.shape.scale,
                max_len, sliding_window=window, out=out[:num_decodes], workspace=self.workspace,
                num_sms=self.num_sms, k_scale=scales.k_scale, v_scale=scales.v_scale,
            )
        num_prefills = meta.num_requests - num_decodes
        if num_prefills > 0:
            paged_prefill_attention(
                query, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                self.shape.scale, meta.max_query_len, first_req=num_decodes, num_reqs=num_prefills,
                sliding_window=window, out=out, k_scale=scales.k_scale, v_scale=scales.v_scale,
            )
        return out

    def _visible(self, max_len: int) -> int:
        window = self.shape.sliding_window
        return max(1, min(max_len, window) if window else max_len)
