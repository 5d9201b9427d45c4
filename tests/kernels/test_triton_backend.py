"""TritonAttentionBackend on a mixed decode + prefill step, and backend selection by name and device."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import cache_write_ref, paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref

SHAPE = AttentionShape(num_heads=8, num_kv_heads=2, head_dim=64, scale=0.125)


def _new_token_slots(batch: PagedBatch, block_size: int) -> list[int]:
    """Slots of each request's last q_len positions, i.e. where this step's keys/values go."""
    slots = []
    for i, seq_len in enumerate(batch.seq_lens_cpu):
        q_len = batch.query_start_loc_cpu[i + 1] - batch.query_start_loc_cpu[i]
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(batch.block_tables[i, pos // block_size]) * block_size + pos % block_size)
    return slots


def _metadata(batch: PagedBatch, slots: list[int], num_decodes: int) -> AttentionMetadata:
    device = batch.query.device
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=batch.query_start_loc, seq_lens=batch.seq_lens, block_tables=batch.block_tables,
        num_decodes=num_decodes, max_query_len=batch.max_query_len, max_seq_len=max(batch.seq_lens_cpu),
        query_start_loc_cpu=batch.query_start_loc_cpu, seq_lens_cpu=batch.seq_lens_cpu,
    )


@pytest.mark.parametrize("sliding_window", [None, 24])
def test_forward_mixed_step_matches_reference(sliding_window: int | None, device: torch.device) -> None:
    # Three decodes (first, as the metadata promises) then a fresh prompt and a chunk after a cached prefix.
    seq_lens, query_lens = [1, 17, 300, 40, 70], [1, 1, 1, 40, 6]
    batch = make_batch(seq_lens, query_lens, 8, 2, 64, 16, torch.float32, device, seed=21)
    slots = _new_token_slots(batch, 16)
    slots[-1] = -1  # a skipped row: its position keeps the cache's old value, which the reference also reads
    # q, k, v as strided views of one fused projection, the way a model splits qkv.
    qkv = torch.randn(batch.query.shape[0], 12, 64, generator=torch.Generator().manual_seed(2)).to(device)
    query, key, value = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    expected_k, expected_v = batch.key_cache.cpu().clone(), batch.value_cache.cpu().clone()
    cache_write_ref(key.cpu(), value.cpu(), expected_k, expected_v, slots)
    ref = paged_attention_ref(query, expected_k, expected_v, batch.block_tables, seq_lens, batch.query_start_loc_cpu,
                              0.125, sliding_window)

    backend = TritonAttentionBackend(AttentionShape(8, 2, 64, 0.125, sliding_window))
    out = backend.forward(query, key, value, batch.key_cache, batch.value_cache, _metadata(batch, slots, 3))

    assert torch.equal(batch.key_cache.cpu(), expected_k) and torch.equal(batch.value_cache.cpu(), expected_v)
    assert_close_to_ref(out, ref, torch.float32)


def test_attend_prefill_only_step(device: torch.device) -> None:
    batch = make_batch([33, 5], [33, 5], 8, 2, 64, 32, torch.bfloat16, device, seed=8)
    out = TritonAttentionBackend(SHAPE).attend(batch.query, batch.key_cache, batch.value_cache,
                                               _metadata(batch, [], 0))
    ref = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                              batch.seq_lens_cpu, batch.query_start_loc_cpu, 0.125)
    assert_close_to_ref(out, ref, torch.bfloat16)


def select_backend(name: str, shape: AttentionShape, device: torch.device):
    platform = CudaPlatform(device) if device.type == "cuda" else CpuPlatform(native_kernels=False)
    return platform.attention_backend(name, shape, torch.float32, torch.float32, 16)


def test_select_triton_on_cpu_under_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    backend = select_backend("triton", SHAPE, torch.device("cpu"))
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton" and backend.shape == SHAPE


def test_select_triton_on_cpu_without_interpreter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        select_backend("triton", SHAPE, torch.device("cpu"))


def test_select_auto_on_cuda_is_triton() -> None:
    backend = select_backend("auto", SHAPE, torch.device("cuda"))  # building the object touches no device
    assert isinstance(backend, TritonAttentionBackend)


@pytest.mark.parametrize("name", ["auto", "torch"])
def test_select_torch_on_cpu(name: str) -> None:
    backend = select_backend(name, SHAPE, torch.device("cpu"))
    assert isinstance(backend, TorchAttentionBackend) and backend.name == "torch" and backend.shape == SHAPE


def test_select_unknown_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        select_backend("flash", SHAPE, torch.device("cpu"))
