"""TorchAttentionBackend on mixed steps (decodes, a fresh prompt, short and long chunks after a cached prefix)."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker.attention.backend import AttentionShape
from services.gpu_worker.attention.torch_backend import SHORT_CHUNK, TorchAttentionBackend
from tests.kernels.paged_batch import make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.test_triton_backend import _metadata, _new_token_slots
from tests.kernels.tolerances import assert_close_to_ref

CPU = torch.device("cpu")


@pytest.mark.parametrize("compile_decode", [False, True])
@pytest.mark.parametrize("sliding_window", [None, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mixed_step_matches_reference(dtype: torch.dtype, sliding_window: int | None, compile_decode: bool) -> None:
    # decodes first; then a fresh prompt, a short chunk after 300 cached tokens (16-bit: the two-GEMM path) and a
    # chunk longer than SHORT_CHUNK after a cached prefix (SDPA)
    long_chunk = SHORT_CHUNK + 22
    seq_lens, query_lens = [1, 17, 300, 40, 306, long_chunk + 50], [1, 1, 1, 40, 6, long_chunk]
    batch = make_batch(seq_lens, query_lens, 6, 2, 64, 16, dtype, CPU, seed=5)
    backend = TorchAttentionBackend(AttentionShape(6, 2, 64, 0.125, sliding_window), compile_decode)
    backend.warm_up(batch.key_cache, batch.value_cache)
    assert backend.decode_compiled is compile_decode
    meta = _metadata(batch, _new_token_slots(batch, 16), 3)
    with torch.inference_mode():
        out = backend.attend(batch.query, batch.key_cache, batch.value_cache, meta)
    ref = paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, seq_lens,
                              batch.query_start_loc_cpu, 0.125, sliding_window)
    assert_close_to_ref(out, ref, dtype)
