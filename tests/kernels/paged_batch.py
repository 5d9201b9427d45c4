"""Random paged batches for kernel tests: scattered block tables over a randomly filled KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch


@dataclass
class PagedBatch:
    query: torch.Tensor  # [T, H, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, KVH, D]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, padded with 0
    seq_lens: torch.Tensor  # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens_cpu: list[int]
    query_start_loc_cpu: list[int]

    @property
    def max_query_len(self) -> int:
        return max(b - a for a, b in pairwise(self.query_start_loc_cpu))


def make_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> PagedBatch:
    """Each request gets its own blocks, drawn in shuffled order so tables are not contiguous; block 0 is unused."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 3  # spare blocks hold noise that must never be read
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    tables = torch.zeros(len(seq_lens), max(blocks_needed), dtype=torch.int32)
    for i, n in enumerate(blocks_needed):
        tables[i, :n] = torch.tensor(order[:n], dtype=torch.int32)
        order = order[n:]
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    qsl = [0]
    for q_len in query_lens:
        qsl.append(qsl[-1] + q_len)
    return PagedBatch(
        query=_randn((qsl[-1], num_heads, head_dim), gen, dtype, device),
        key_cache=_randn(cache_shape, gen, dtype, device),
        value_cache=_randn(cache_shape, gen, dtype, device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens_cpu=list(seq_lens),
        query_start_loc_cpu=qsl,
    )


def _randn(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype=dtype, device=device)
