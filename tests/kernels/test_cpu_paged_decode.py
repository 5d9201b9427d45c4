"""The C paged decode attention (kernels/cpu) against the fp32 reference, and the torch backend's use of it."""

from __future__ import annotations

import logging

import pytest
import torch

import pagedserve.kernels.cpu.paged_decode as native
from pagedserve.kernels.cpu.build import KernelBuildError
from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref

CPU = torch.device("cpu")


def _batch(group: int, head_dim: int, dtype: torch.dtype, block_size: int, seed: int) -> PagedBatch:
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 150, 333]  # partial, exact and one-over last blocks
    return make_batch(seq_lens, [1] * len(seq_lens), group * 2, 2, head_dim, block_size, dtype, CPU, seed=seed)


def _ref(batch: PagedBatch, scale: float, window: int) -> torch.Tensor:
    return paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                               batch.seq_lens_cpu, batch.query_start_loc_cpu, scale, window or None)


@pytest.mark.parametrize("window", [0, 7, 100])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(dtype: torch.dtype, head_dim: int, group: int, window: int) -> None:
    batch = _batch(group, head_dim, dtype, 16, seed=group + window + head_dim)
    scale = head_dim ** -0.5
    out = native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                     batch.seq_lens, scale, window)
    assert_close_to_ref(out, _ref(batch, scale, window), dtype)


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp16_cache_under_fp32_queries(head_dim: int, group: int, window: int) -> None:
    """An fp16 cache (half the bytes a step reads) with fp32 queries and outputs: fp32 sums over the fp16 values."""
    batch = _batch(group, head_dim, torch.float32, 16, seed=group + head_dim)
    batch.key_cache, batch.value_cache = batch.key_cache.half(), batch.value_cache.half()
    scale = head_dim ** -0.5
    out = native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                     batch.seq_lens, scale, window)
    assert_close_to_ref(out, _ref(batch, scale, window), torch.float32)


@pytest.mark.parametrize("block_size", [2, 8, 32])
def test_other_block_sizes(block_size: int) -> None:
    batch = _batch(3, 64, torch.bfloat16, block_size, seed=block_size)
    out = native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                     batch.seq_lens, 0.125, 0)
    assert_close_to_ref(out, _ref(batch, 0.125, 0), torch.bfloat16)


def _big_batch(group: int, kv_heads: int, dtype: torch.dtype, seed: int) -> PagedBatch:
    """Enough requests that one task takes several (or all) kv heads of a request."""
    seq_lens = [1 + (37 * i) % 301 for i in range(40)]
    return make_batch(seq_lens, [1] * len(seq_lens), group * kv_heads, kv_heads, 64, 16, dtype, CPU, seed=seed)


@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize(("group", "kv_heads"), [(3, 3), (1, 2), (16, 4)])  # (16, 4): two of four kv heads a task
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_large_batches_match_reference(cache_dtype: torch.dtype, group: int, kv_heads: int, window: int) -> None:
    batch = _big_batch(group, kv_heads, torch.bfloat16, seed=group + kv_heads + window)
    if cache_dtype == torch.float16:
        batch.query = batch.query.float()
        batch.key_cache, batch.value_cache = batch.key_cache.half(), batch.value_cache.half()
    out = native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                     batch.seq_lens, 0.125, window)
    assert_close_to_ref(out, _ref(batch, 0.125, window), batch.query.dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_request_gets_the_same_numbers_alone_or_in_a_batch(threads: int) -> None:
    """Large batches hand a task all kv heads of a request, small ones one: the numbers must not change."""
    batch = _big_batch(3, 3, torch.float32, seed=5)
    batch.key_cache, batch.value_cache = batch.key_cache.half(), batch.value_cache.half()
    decode = native.NativePagedDecode()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = decode(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                          0.125, 0)
        for i in (0, 7, 39):
            alone = decode(batch.query[i:i + 1], batch.key_cache, batch.value_cache, batch.block_tables[i:i + 1],
                           batch.seq_lens[i:i + 1], 0.125, 0)
            assert torch.equal(alone[0], together[i])
    finally:
        torch.set_num_threads(previous)


def test_softmax_is_stable_for_large_scores() -> None:
    """Scores in the hundreds (exp would overflow without subtracting the max) still give the reference."""
    batch = _batch(3, 64, torch.float32, 16, seed=3)
    batch.query.mul_(40.0)
    out = native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                     batch.seq_lens, 0.125, 0)
    assert torch.isfinite(out).all()
    assert_close_to_ref(out, _ref(batch, 0.125, 0), torch.float32)


def test_unsupported_shapes_are_refused() -> None:
    assert native.supports(torch.bfloat16, 9, 3, 64) and native.supports(torch.float32, 9, 3, 64, torch.float16)
    assert not native.supports(torch.float16, 9, 3, 64)
    assert not native.supports(torch.bfloat16, 9, 3, 64, torch.float16)
    assert not native.supports(torch.float32, 9, 3, 80)
    assert not native.supports(torch.float32, 34, 2, 64)  # group of 17
    batch = _batch(1, 64, torch.float16, 16, seed=0)
    with pytest.raises(ValueError, match="no C decode kernel"):
        native.NativePagedDecode()(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                   batch.seq_lens, 0.125, 0)


def _platform_backend(cache: torch.Tensor) -> TorchAttentionBackend:
    """The CPU platform's default (C kernels and torch.compile on) over `cache`."""
    backend = CpuPlatform(native_kernels=True, torch_compile=True).attention_backend(
        "torch", AttentionShape(6, 2, 64, 0.125), cache.dtype, cache.dtype, cache.shape[1])
    backend.warm_up(cache, cache.clone())
    return backend


def test_backend_uses_the_c_kernel_by_default_on_cpu() -> None:
    backend = _platform_backend(torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16))
    assert backend.decode_native and not backend.decode_compiled


def test_backend_falls_back_to_compiled_when_the_kernel_cannot_build(monkeypatch, caplog) -> None:
    def no_compiler(name: str):
        raise KernelBuildError("no C compiler found")

    monkeypatch.setattr(native, "load_kernel", no_compiler)
    with caplog.at_level(logging.WARNING):
        backend = _platform_backend(torch.zeros(8, 16, 2, 64))
    assert backend.decode_compiled and not backend.decode_native
    assert "C decode attention kernel is unavailable" in caplog.text
