"""The C paged decode attention (paged_decode.c) behind the same call as the torch version."""

from __future__ import annotations

import ctypes

import torch

from pagedserve.kernels.cpu.build import ATTENTION_TYPES, bind, load_kernel

HEAD_DIMS = (64, 128)
MAX_GROUP = 16  # query heads per kv head (paged_decode.c)
_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 4 + [
    ctypes.c_float, ctypes.c_int, ctypes.c_int]


def supports(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
             cache_dtype: torch.dtype | None = None) -> bool:
    """`dtype`: the query's (and output's); `cache_dtype`: the KV cache's, by default the same."""
    return ((dtype, cache_dtype or dtype) in ATTENTION_TYPES and head_dim in HEAD_DIMS
            and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP)


class NativePagedDecode:
    """query [B, H, D], caches [N, block_size, Hkv, D], block_tables [B, nb] int32, seq_lens [B] int32 -> [B, H, D]
    (the contract of pagedserve.services.gpu_worker.attention.cpu_decode.paged_decode, on CPU tensors)."""

    def __init__(self) -> None:
        library = load_kernel("paged_decode")
        self.entries = {(*types, head_dim): bind(library, f"paged_decode_{name}_d{head_dim}", _ARGTYPES)
                        for types, name in ATTENTION_TYPES.items() for head_dim in HEAD_DIMS}

    def __call__(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float, window: int) -> torch.Tensor:
        batch, num_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[2]
        if not supports(query.dtype, num_heads, num_kv_heads, head_dim, key_cache.dtype):
            raise ValueError(f"no C decode kernel for {query.dtype} over a {key_cache.dtype} cache, "
                             f"{num_heads}/{num_kv_heads} heads of {head_dim}")
        query = query.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
            raise ValueError("the C decode kernel needs contiguous key/value caches")
        out = torch.empty_like(query)
        failed = self.entries[query.dtype, key_cache.dtype, head_dim](
            query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
            lens.data_ptr(), out.data_ptr(), batch, num_heads, num_kv_heads, key_cache.shape[1], scale, window,
            torch.get_num_threads())
        if failed:
            raise MemoryError("the C decode kernel could not allocate its scratch")
        return out
