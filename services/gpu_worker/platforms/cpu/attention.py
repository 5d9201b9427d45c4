"""The CPU platform's attention backend: the torch backend with the C decode and prefill kernels where they build
and take the shapes and dtypes, torch.compile or eager torch otherwise; Triton only through its interpreter."""

from __future__ import annotations

import os

import torch

from pagedserve.kernels.cpu.build import built_or_none
from pagedserve.kernels.cpu.paged_decode import NativePagedDecode
from pagedserve.kernels.cpu.paged_decode import supports as supports_decode
from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill
from pagedserve.kernels.cpu.paged_prefill import supports as supports_prefill
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from pagedserve.services.gpu_worker.attention.cpu_decode import compiled_paged_decode, paged_decode
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend, decode_dummy
from pagedserve.services.gpu_worker.platforms.cpu.native import NativeKernels


def triton_backend(shape: AttentionShape, triton_interpret: bool) -> AttentionBackend:
    """Triton's kernels on CPU tensors, through its (slow) interpreter: for tests."""
    if not triton_interpret:
        raise ValueError("attention backend 'triton' needs a CUDA device, or TRITON_INTERPRET=1 set before start "
                         "to run its kernels in the (slow) interpreter on cpu")
    from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(shape)


def torch_backend(shape: AttentionShape, query_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int,
                  native: NativeKernels | None, torch_compile: bool, batch_invariant: bool) -> TorchAttentionBackend:
    """Decode attention: the C kernel, else compiled, else eager; prompt chunks: the C kernel, else SDPA. In
    batch-invariant mode decodes too go through the C prefill kernel (one kernel for every row), which it needs."""
    prefill = _native_prefill(shape, query_dtype, cache_dtype, block_size, native) if native else None
    if batch_invariant:
        if prefill is None:
            raise ValueError(f"--batch-invariant needs the C prefill attention kernel, which does not run here "
                             f"({query_dtype} queries over a {cache_dtype} cache, head size {shape.head_dim}, "
                             f"blocks of {block_size}, native kernels {'on' if native else 'off'})")
        return TorchAttentionBackend(shape, prefill_fn=prefill, decodes_as_chunks=True)
    decode = _native_decode(shape, query_dtype, cache_dtype, block_size, native) if native else None
    if decode is not None:
        return TorchAttentionBackend(shape, decode, decode_native=True, prefill_fn=prefill)
    return TorchAttentionBackend(shape, compiled_paged_decode() if torch_compile else paged_decode,
                                 prefill_fn=prefill)


def triton_interpreted() -> bool:
    """Triton decides at import time whether kernels compile or run in its interpreter, from this variable."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _dummy_caches(shape: AttentionShape, cache_dtype: torch.dtype, block_size: int):
    size = (2, block_size, shape.num_kv_heads, shape.head_dim)
    return torch.zeros(size, dtype=cache_dtype), torch.zeros(size, dtype=cache_dtype)


def _native_decode(shape: AttentionShape, query_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int,
                   native: NativeKernels) -> NativePagedDecode | None:
    if not supports_decode(query_dtype, shape.num_heads, shape.num_kv_heads, shape.head_dim, cache_dtype):
        return None
    kernel = native.paged_decode

    def tried() -> NativePagedDecode:
        decode_dummy(kernel, shape, *_dummy_caches(shape, cache_dtype, block_size), 2, 2, query_dtype)
        return kernel

    return None if kernel is None else built_or_none("the C decode attention kernel", tried)


def _native_prefill(shape: AttentionShape, query_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int,
                    native: NativeKernels) -> NativePagedPrefill | None:
    if not supports_prefill(query_dtype, shape.num_heads, shape.num_kv_heads, shape.head_dim, block_size,
                            cache_dtype):
        return None
    kernel = native.paged_prefill

    def tried() -> NativePagedPrefill:
        query = torch.zeros(3, shape.num_heads, shape.head_dim, dtype=query_dtype)
        starts, lens = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
        kernel(query, *_dummy_caches(shape, cache_dtype, block_size), torch.zeros(1, 1, dtype=torch.int32), starts,
               lens, shape.scale, shape.sliding_window or 0)
        return kernel

    return None if kernel is None else built_or_none("the C prefill attention kernel", tried)
