"""The torch backend's batched decode attention (eager and torch.compile'd) against the plain reference."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.attention.cpu_decode import compiled_paged_decode, paged_decode
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref

CPU = torch.device("cpu")


def _batch(group: int, dtype: torch.dtype, block_size: int = 16, seed: int = 0) -> PagedBatch:
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 150]  # partial, exact and one-over last blocks
    return make_batch(seq_lens, [1] * len(seq_lens), group * 2, 2, 64, block_size, dtype, CPU, seed=seed)


def _decode(fn, batch: PagedBatch, window: int) -> torch.Tensor:
    num_blocks = -(-max(batch.seq_lens_cpu) // batch.key_cache.shape[1])
    return fn(batch.query, batch.key_cache, batch.value_cache, batch.block_tables[:, :num_blocks].long(),
              batch.seq_lens.long(), 0.125, window)


def _ref(batch: PagedBatch, window: int) -> torch.Tensor:
    return paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                               batch.seq_lens_cpu, batch.query_start_loc_cpu, 0.125, window or None)


@pytest.mark.parametrize("window", [0, 7])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eager_matches_reference(dtype: torch.dtype, group: int, window: int) -> None:
    batch = _batch(group, dtype, seed=group + window)
    assert_close_to_ref(_decode(paged_decode, batch, window), _ref(batch, window), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_matches_reference_across_batch_shapes(dtype: torch.dtype) -> None:
    """One compiled function serves batches and context lengths of every size, including size-1 ones."""
    compiled = compiled_paged_decode()
    with torch.inference_mode():
        for seed, (group, block_size) in enumerate([(3, 16), (3, 16), (1, 8)]):
            batch = _batch(group, dtype, block_size, seed)
            assert_close_to_ref(_decode(compiled, batch, 0), _ref(batch, 0), dtype)
            single = make_batch([5], [1], group * 2, 2, 64, block_size, dtype, CPU, seed=seed)
            assert_close_to_ref(_decode(compiled, single, 0), _ref(single, 0), dtype)


def test_backend_warm_up_compiles_decode() -> None:
    """The serving default: warm-up compiles the decode graphs and keeps them (no silent fall-back to eager)."""
    backend = TorchAttentionBackend(AttentionShape(6, 2, 64, 0.125), compiled_paged_decode())
    cache = torch.zeros(8, 16, 2, 64)
    backend.warm_up(cache, cache.clone())
    assert backend.decode_compiled
