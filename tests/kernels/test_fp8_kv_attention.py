"""Decode and prefill attention over float8_e4m3fn caches with per-layer k/v scales != 1: they equal the fp32
reference computed on the same dequantized values (e4m3 code x scale), at fp32 tolerance."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_decode_attention import paged_decode_attention
from pagedserve.kernels.paged_prefill_attention import paged_prefill_attention
from pagedserve.services.gpu_worker.attention.backend import AttentionShape, KVScales
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref

FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.75, 1.5


def _fp8_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, query_dtype: torch.dtype, device: torch.device, seed: int) -> PagedBatch:
    """A random batch whose caches are e4m3 codes of (cache / scale): values spread over e4m3's range."""
    batch = make_batch(seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, torch.float32, device,
                       seed)
    batch.query = batch.query.to(query_dtype)
    batch.key_cache = (batch.key_cache * 3 / K_SCALE).to(FP8)
    batch.value_cache = (batch.value_cache * 3 / V_SCALE).to(FP8)
    return batch


def _ref(batch: PagedBatch, scale: float, window: int | None = None) -> torch.Tensor:
    """The reference sees the dequantized caches: fp32 code values times their scale."""
    return paged_attention_ref(batch.query, batch.key_cache.float() * K_SCALE, batch.value_cache.float() * V_SCALE,
                               batch.block_tables, batch.seq_lens_cpu, batch.query_start_loc_cpu, scale, window)


@pytest.mark.parametrize("partition_size", [None, 32])
@pytest.mark.parametrize("window", [None, 40])
def test_decode_over_fp8_cache(partition_size: int | None, window: int | None, device: torch.device) -> None:
    batch = _fp8_batch([1, 17, 33, 130], [1] * 4, 8, 2, 64, 16, torch.float32, device, seed=5)
    out = paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                                 0.125, 130, sliding_window=window, partition_size=partition_size,
                                 k_scale=K_SCALE, v_scale=V_SCALE)
    ref = _ref(batch, 0.125, window)
    assert_close_to_ref(out, ref, torch.float32)
    # The scales matter: ignoring them is far off (the test can fail).
    unscaled = paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                      batch.seq_lens, 0.125, 130, sliding_window=window)
    assert (unscaled - ref).abs().max() > 0.1


@pytest.mark.parametrize("window", [None, 20])
def test_prefill_over_fp8_cache(window: int | None, device: torch.device) -> None:
    # Chunks after a cached prefix, a whole prompt, and a one-token chunk; GQA group 4.
    batch = _fp8_batch([40, 23, 70], [9, 23, 1], 8, 2, 64, 16, torch.float32, device, seed=9)
    out = paged_prefill_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                  batch.seq_lens, batch.query_start_loc, 0.125, batch.max_query_len,
                                  sliding_window=window, k_scale=K_SCALE, v_scale=V_SCALE)
    assert_close_to_ref(out, _ref(batch, 0.125, window), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_queries_over_fp8_cache(dtype: torch.dtype, device: torch.device) -> None:
    """A half-precision model's queries: e4m3 converts exactly to fp16/bf16, so only the usual half roundings."""
    batch = _fp8_batch([1, 17, 90], [1, 1, 1], 8, 2, 64, 16, dtype, device, seed=2)
    decode = paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                    batch.seq_lens, 0.125, 90, partition_size=32, k_scale=K_SCALE, v_scale=V_SCALE)
    prefill = paged_prefill_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                      batch.seq_lens, batch.query_start_loc, 0.125, 1, k_scale=K_SCALE,
                                      v_scale=V_SCALE)
    ref = _ref(batch, 0.125)
    # Values reach 3 x 4 = 12 in magnitude here (randn x 3), so scale the half tolerance by that range.
    torch.testing.assert_close(decode.float().cpu(), ref, atol=12 * 6 * 2**-8, rtol=2 * 2**-8)
    torch.testing.assert_close(prefill.float().cpu(), ref, atol=12 * 6 * 2**-8, rtol=2 * 2**-8)


def test_triton_backend_writes_and_attends_with_the_layer_scales(device: torch.device) -> None:
    """backend.forward(..., KVScales): the step's rows are stored as e4m3(row / scale), then attended dequantized."""
    batch = _fp8_batch([1, 17, 40, 70], [1, 1, 40, 6], 8, 2, 64, 16, torch.float32, device, seed=4)
    slots = []
    for i, seq_len in enumerate(batch.seq_lens_cpu):
        q_len = batch.query_start_loc_cpu[i + 1] - batch.query_start_loc_cpu[i]
        slots += [int(batch.block_tables[i, p // 16]) * 16 + p % 16 for p in range(seq_len - q_len, seq_len)]
    gen = torch.Generator().manual_seed(6)
    key = (torch.randn(len(slots), 2, 64, generator=gen) * 3).to(device)
    value = (torch.randn(len(slots), 2, 64, generator=gen) * 3).to(device)
    expected_k, expected_v = batch.key_cache.cpu().clone(), batch.value_cache.cpu().clone()
    for t, slot in enumerate(slots):
        expected_k[slot // 16, slot % 16] = (key[t].cpu() / K_SCALE).to(FP8)
        expected_v[slot // 16, slot % 16] = (value[t].cpu() / V_SCALE).to(FP8)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device), query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens, block_tables=batch.block_tables, num_decodes=2, max_query_len=batch.max_query_len,
        max_seq_len=70, query_start_loc_cpu=batch.query_start_loc_cpu, seq_lens_cpu=batch.seq_lens_cpu)

    out = TritonAttentionBackend(AttentionShape(8, 2, 64, 0.125)).forward(
        batch.query, key, value, batch.key_cache, batch.value_cache, meta, KVScales(K_SCALE, V_SCALE))

    assert torch.equal(batch.key_cache.cpu().view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(batch.value_cache.cpu().view(torch.uint8), expected_v.view(torch.uint8))
    ref = paged_attention_ref(batch.query, expected_k.float() * K_SCALE, expected_v.float() * V_SCALE,
                              batch.block_tables, batch.seq_lens_cpu, batch.query_start_loc_cpu, 0.125)
    assert_close_to_ref(out, ref, torch.float32)
