"""Batched paged decode attention for the torch backend, written so that torch.compile can fuse it on CPU.

Inductor turns the block gather, the q·k reduction, the masked softmax and the p·v reduction into a few loops
that read each request's keys and values straight out of the paged cache: no gathered copy of the context, no
small batched GEMMs. Eagerly the same function is a correct (slower) reference.
"""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.compiling import compile_function


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, window: int) -> torch.Tensor:
    """query [B, H, D], caches [N, block_size, Hkv, D], block_tables [B, nb] int64, seq_lens [B] int64
    -> [B, H, D]. Each query is its request's last position; it sees keys in (seq_len - 1 - window, seq_len)
    (window 0 means no sliding window)."""
    batch, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    length = block_tables.shape[1] * block_size
    keys = key_cache[block_tables].view(batch, length, num_kv_heads, 1, head_dim)
    values = value_cache[block_tables].view(batch, length, num_kv_heads, 1, head_dim)
    q = query.reshape(batch, 1, num_kv_heads, group, head_dim).float()
    # [B, Hkv, G, L]: the softmax reduces over the innermost dim (Inductor parallelises it over rows, not keys)
    scores = ((keys.float() * q).sum(-1) * scale).permute(0, 2, 3, 1)
    pos = torch.arange(length, device=query.device)[None, :]
    hidden = pos >= seq_lens[:, None]
    if window > 0:
        hidden = hidden | (pos <= seq_lens[:, None] - 1 - window)
    probs = torch.softmax(scores.masked_fill(hidden[:, None, None, :], float("-inf")), dim=-1)
    out = (probs.permute(0, 3, 1, 2).unsqueeze(-1) * values.float()).sum(1)  # [B, Hkv, G, D]
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


def compiled_paged_decode():
    """`paged_decode` compiled with dynamic batch and context sizes after the first change of each (sizes of 1
    specialise: one model takes four graphs per dtype)."""
    return compile_function(paged_decode, fullgraph=True)
