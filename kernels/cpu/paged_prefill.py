"""The C paged prefill attention (paged_prefill.c): a step's prompt chunks against their cached contexts."""

from __future__ import annotations

import ctypes

import torch

from pagedserve.kernels.cpu.build import ATTENTION_TYPES, bind, load_kernel

_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] + [
    ctypes.c_int] * 5 + [ctypes.c_float, ctypes.c_int, ctypes.c_int]


def supports(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
             cache_dtype: torch.dtype | None = None) -> bool:
    """`dtype`: the query's (and output's); `cache_dtype`: the KV cache's, by default the same."""
    return ((dtype, cache_dtype or dtype) in ATTENTION_TYPES and head_dim % 16 == 0 and head_dim <= 128
            and block_size % 16 == 0 and num_heads % num_kv_heads == 0)


class NativePagedPrefill:
    """query [T, H, D] (the chunks, back to back), caches [N, block_size, Hkv, D], block_tables [B, nb],
    query_starts [B + 1] (chunk i: rows query_starts[i]:query_starts[i+1], the last of its seq_lens[i] positions)
    -> [T, H, D]."""

    def __init__(self) -> None:
        library = load_kernel("paged_prefill")
        self.entries = {types: bind(library, f"paged_prefill_{name}", _ARGTYPES)
                        for types, name in ATTENTION_TYPES.items()}

    def __call__(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, query_starts: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                 window: int) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
        if not supports(query.dtype, num_heads, num_kv_heads, head_dim, block_size, key_cache.dtype):
            raise ValueError(f"no C prefill kernel for {query.dtype} over a {key_cache.dtype} cache, "
                             f"{num_heads}/{num_kv_heads} heads of {head_dim}, blocks of {block_size}")
        if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
            raise ValueError("the C prefill kernel needs contiguous key/value caches")
        query = query.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        starts = query_starts.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        if starts.shape[0] != lens.shape[0] + 1 or int(starts[-1]) != num_tokens:
            raise ValueError("query_starts must have one entry more than seq_lens and end at the token count")
        out = torch.empty_like(query)
        failed = self.entries[query.dtype, key_cache.dtype](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
            starts.data_ptr(), lens.data_ptr(), out.data_ptr(), lens.shape[0], num_heads, num_kv_heads, head_dim,
            block_size, scale, window, torch.get_num_threads())
        if failed:
            raise MemoryError("the C prefill kernel could not allocate its scratch")
        return out
