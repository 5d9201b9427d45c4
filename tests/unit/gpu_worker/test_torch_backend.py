"""TorchAttentionBackend on mixed steps (decodes, a fresh prompt, short and long chunks after a cached prefix)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.attention.torch_backend import SHORT_CHUNK, TorchAttentionBackend
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from tests.kernels.paged_batch import make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.test_triton_backend import _metadata, _new_token_slots
from tests.kernels.tolerances import assert_close_to_ref

CPU = torch.device("cpu")
KERNELS = {"eager": {"native_kernels": False, "torch_compile": False},  # CpuPlatform options of each variant
           "compiled": {"native_kernels": False, "torch_compile": True},
           "native": {"native_kernels": True, "torch_compile": False},
           "batch-invariant": {"native_kernels": True, "torch_compile": False, "batch_invariant": True}}


def cpu_backend(shape: AttentionShape, kernels: str, key_cache: torch.Tensor, value_cache: torch.Tensor,
                query_dtype: torch.dtype | None = None) -> TorchAttentionBackend:
    """The CPU platform's torch backend with `kernels`, warmed up on the caches (as the worker builds it)."""
    query_dtype = query_dtype or key_cache.dtype
    backend = CpuPlatform(**KERNELS[kernels]).attention_backend("torch", shape, query_dtype, key_cache.dtype,
                                                                key_cache.shape[1])
    backend.warm_up(key_cache, value_cache, query_dtype)
    return backend


@pytest.mark.parametrize("kernels", ["eager", "compiled", "native"])
@pytest.mark.parametrize("sliding_window", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_step_matches_reference(dtype: torch.dtype, sliding_window: int | None, kernels: str) -> None:
    # decodes first; then a fresh prompt, a short chunk after 300 cached tokens (16-bit: the two-GEMM path) and a
    # chunk longer than SHORT_CHUNK after a cached prefix (SDPA); "native": every chunk in the C prefill kernel
    long_chunk = SHORT_CHUNK + 22
    seq_lens, query_lens = [1, 17, 300, 40, 306, long_chunk + 50], [1, 1, 1, 40, 6, long_chunk]
    batch = make_batch(seq_lens, query_lens, 6, 2, 64, 16, dtype, CPU, seed=5)
    backend = cpu_backend(AttentionShape(6, 2, 64, 0.125, sliding_window), kernels, batch.key_cache,
                          batch.value_cache)
    assert backend.decode_compiled is (kernels == "compiled")
    assert backend.decode_native is (kernels == "native") and (backend.prefill_fn is not None) is (kernels == "native")
    meta = _metadata(batch, _new_token_slots(batch, 16), 3)
    with torch.inference_mode():
        out = backend.attend(batch.query, batch.key_cache, batch.value_cache, meta)
    ref = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, seq_lens,
                              batch.query_start_loc_cpu, 0.125, sliding_window)
    assert_close_to_ref(out, ref, dtype)


@pytest.mark.parametrize("kernels", ["eager", "native"])
def test_fp16_cache_under_fp32_queries(kernels: str) -> None:
    """The CPU default for fp32 models: new keys and values are stored in fp16, every path reads them back into
    fp32 sums (C kernels, or the torch decode and SDPA)."""
    seq_lens, query_lens = [1, 300, 40, 306, 200], [1, 1, 40, 6, 150]
    batch = make_batch(seq_lens, query_lens, 6, 2, 64, 16, torch.float32, CPU, seed=7)
    key_cache, value_cache = batch.key_cache.half(), batch.value_cache.half()
    backend = cpu_backend(AttentionShape(6, 2, 64, 0.125), kernels, key_cache, value_cache, torch.float32)
    assert backend.decode_native is (kernels == "native") and (backend.prefill_fn is not None) is (kernels == "native")
    slots = _new_token_slots(batch, 16)
    meta = _metadata(batch, slots, 2)
    keys, values = torch.randn(2, len(slots), 2, 64).unbind(0)
    with torch.inference_mode():
        out = backend.forward(batch.query, keys, values, key_cache, value_cache, meta)
    assert out.dtype == torch.float32
    stored = key_cache.view(-1, 2, 64)[torch.tensor(slots)]
    assert stored.dtype == torch.float16 and torch.equal(stored, keys.half())
    ref = paged_attention_ref(batch.query, key_cache, value_cache, batch.block_tables, seq_lens,
                              batch.query_start_loc_cpu, 0.125)
    assert_close_to_ref(out, ref, torch.float32)


def test_prefill_kernel_falls_back_to_sdpa_when_it_cannot_build(monkeypatch, caplog) -> None:
    import logging

    import pagedserve.services.gpu_worker.platforms.cpu.native as native
    from pagedserve.kernels.cpu.build import KernelBuildError

    def no_compiler():
        raise KernelBuildError("no C compiler found")

    monkeypatch.setattr(native, "NativePagedPrefill", no_compiler)
    batch = make_batch([30], [30], 6, 2, 64, 16, torch.float32, CPU, seed=1)
    with caplog.at_level(logging.WARNING):
        backend = cpu_backend(AttentionShape(6, 2, 64, 0.125, None), "native", batch.key_cache, batch.value_cache)
    assert backend.prefill_fn is None and backend.decode_native  # only the prefill kernel fell back
    assert "C prefill attention kernel is unavailable" in caplog.text
    meta = _metadata(batch, _new_token_slots(batch, 16), 0)
    with torch.inference_mode():
        out = backend.attend(batch.query, batch.key_cache, batch.value_cache, meta)
    ref = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, [30],
                              batch.query_start_loc_cpu, 0.125, None)
    assert_close_to_ref(out, ref, torch.float32)


def test_forward_writes_every_layer_and_skips_negative_slots() -> None:
    """The skipped slots are found once a step (meta.scratch) and every layer's cache gets the same slots."""
    backend = TorchAttentionBackend(AttentionShape(2, 2, 16, 0.25, None))
    backend.attend = lambda query, key_cache, value_cache, meta: query
    meta = AttentionMetadata(slot_mapping=torch.tensor([3, -1, 9]), query_start_loc=torch.tensor([0, 3]),
                             seq_lens=torch.tensor([3]), block_tables=torch.zeros(1, 2, dtype=torch.int32),
                             num_decodes=0, max_query_len=3, max_seq_len=3, query_start_loc_cpu=[0, 3],
                             seq_lens_cpu=[3])
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    for layer in range(2):
        caches = torch.zeros(2, 2, 8, 2, 16)  # [key/value, blocks, block_size, heads, head_dim]
        backend.forward(key, key, value, caches[0], caches[1], meta)
        for cache, rows in ((caches[0], key), (caches[1], value)):
            flat = cache.view(-1, 2, 16)
            assert torch.equal(flat[3], rows[0]) and torch.equal(flat[9], rows[2]), layer
            assert int((flat.abs().sum((1, 2)) > 0).sum()) == 2  # row 1 (slot -1) went nowhere
    assert "torch.slots" in meta.scratch


@pytest.mark.parametrize("native", [False, True])
def test_decode_only_step_matches_reference(native: bool) -> None:
    """A step of decodes only returns the decode kernel's output as it is (no shared output buffer)."""
    seq_lens = [1, 17, 300]
    batch = make_batch(seq_lens, [1, 1, 1], 6, 2, 64, 16, torch.float32, CPU, seed=9)
    backend = cpu_backend(AttentionShape(6, 2, 64, 0.125, None), "native" if native else "eager", batch.key_cache,
                          batch.value_cache)
    meta = _metadata(batch, _new_token_slots(batch, 16), 3)
    with torch.inference_mode():
        out = backend.attend(batch.query, batch.key_cache, batch.value_cache, meta)
    ref = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, seq_lens,
                              batch.query_start_loc_cpu, 0.125, None)
    assert out.shape == batch.query.shape
    assert_close_to_ref(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_invariant_decodes_get_the_numbers_of_their_prompt_rows(dtype: torch.dtype) -> None:
    """Batch-invariant mode: decodes go through the prefill kernel as one-row chunks, so a decode at position p
    gets, bit for bit, what the same query gets as row p of a prompt chunk (a recompute after preemption)."""
    chunk = make_batch([300], [60], 6, 2, 64, 16, dtype, CPU, seed=11)  # positions 240..299 in one chunk
    backend = cpu_backend(AttentionShape(6, 2, 64, 0.125, None), "batch-invariant", chunk.key_cache,
                          chunk.value_cache)
    assert backend.decodes_as_chunks and backend.prefill_fn is not None
    with torch.inference_mode():
        as_chunk = backend.attend(chunk.query, chunk.key_cache, chunk.value_cache,
                                  _metadata(chunk, _new_token_slots(chunk, 16), 0))
        positions = [240, 271, 299]
        decodes = dataclasses.replace(
            chunk, query=chunk.query[[p - 240 for p in positions]], block_tables=chunk.block_tables.expand(3, -1),
            seq_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
            query_start_loc=torch.arange(4, dtype=torch.int32), seq_lens_cpu=[p + 1 for p in positions],
            query_start_loc_cpu=[0, 1, 2, 3])
        as_decodes = backend.attend(decodes.query, chunk.key_cache, chunk.value_cache, _metadata(decodes, [], 3))
    assert torch.equal(as_decodes, as_chunk[[p - 240 for p in positions]])
