"""The C paged prefill attention (kernels/cpu/paged_prefill.c) against a float64 reference over gathered keys."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill, supports


def _reference(query, key_cache, value_cache, tables, starts, lens, scale, window) -> torch.Tensor:
    num_heads, num_kv_heads, block_size = query.shape[1], key_cache.shape[2], key_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=torch.float64)
    for i, length in enumerate(lens.tolist()):
        first, last = int(starts[i]), int(starts[i + 1])
        num_blocks = -(-length // block_size)
        keys = key_cache[tables[i, :num_blocks].long()].reshape(-1, num_kv_heads, query.shape[2])[:length].double()
        values = value_cache[tables[i, :num_blocks].long()].reshape(-1, num_kv_heads, query.shape[2])[:length]
        q_pos = torch.arange(length - (last - first), length)[:, None]
        k_pos = torch.arange(length)[None, :]
        hidden = (k_pos > q_pos) | ((k_pos <= q_pos - window) if window else False)
        for h in range(num_heads):
            scores = query[first:last, h].double() @ keys[:, h // group].T * scale
            probs = torch.softmax(scores.masked_fill(hidden, -math.inf), dim=-1)
            out[first:last, h] = probs @ values[:, h // group].double()
    return out


def _step(dtype, num_heads, num_kv_heads, head_dim, block_size, seq_lens, q_lens, seed=0):
    """Paged caches with shuffled blocks, and chunks of q_lens tokens ending at seq_lens."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=gen).to(dtype)
    value_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(blocks) + 2, dtype=torch.int32)  # padded with block 0
    used = 0
    for i, n in enumerate(blocks):
        tables[i, :n] = order[used:used + n]
        used += n
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    query = torch.randn(int(starts[-1]), num_heads, head_dim, generator=gen).to(dtype)
    return query, key_cache, value_cache, tables, starts, torch.tensor(seq_lens, dtype=torch.int32)


TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


# whole prompts, chunks after a cached context, a one-token chunk, several row tasks (3 x 120 rows), tails of
# every length; GQA groups 3 and 1; head sizes 64 and 128; blocks of 16 and 32; a sliding window
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "block_size", "window"), [
    (9, 3, 64, 16, 0), (4, 4, 128, 32, 0), (8, 2, 64, 16, 20)])
def test_matches_reference(dtype, num_heads, num_kv_heads, head_dim, block_size, window) -> None:
    step = _step(dtype, num_heads, num_kv_heads, head_dim, block_size, [37, 5, 130, 200, 1], [37, 1, 17, 120, 1])
    out = NativePagedPrefill()(*step, 0.125, window)
    assert out.shape == step[0].shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), _reference(*step, 0.125, window), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tail_chunk_gives_the_whole_prompts_numbers(dtype) -> None:
    """The last 40 tokens of a 150-token prompt as a chunk over the 110 before them (a prefix-cache hit) give the
    same outputs, bit for bit, as the whole prompt: a row's sums do not depend on the chunking or the row tasks
    (on AVX512-BF16 machines this is the bf16 pair path, whose key pairs sit at fixed positions)."""
    query, key_cache, value_cache, tables, _, lens = _step(dtype, 9, 3, 64, 16, [150], [150], seed=5)
    whole = NativePagedPrefill()(query, key_cache, value_cache, tables, torch.tensor([0, 150], dtype=torch.int32),
                                 lens, 0.125, 0)
    tail = NativePagedPrefill()(query[110:], key_cache, value_cache, tables, torch.tensor([0, 40], dtype=torch.int32),
                                lens, 0.125, 0)
    assert torch.equal(tail, whole[110:])


@pytest.mark.parametrize("window", [0, 20])
def test_fp16_cache_under_fp32_queries(window: int) -> None:
    """An fp16 cache with fp32 queries and outputs: pieces widened to fp32, the same numbers as fp32 caches holding
    the fp16 values."""
    query, key_cache, value_cache, *rest = _step(torch.float32, 9, 3, 64, 16, [37, 130, 200], [37, 17, 120], seed=4)
    key_cache, value_cache = key_cache.half(), value_cache.half()
    out = NativePagedPrefill()(query, key_cache, value_cache, *rest, 0.125, window)
    assert out.dtype == torch.float32
    widened = NativePagedPrefill()(query, key_cache.float(), value_cache.float(), *rest, 0.125, window)
    torch.testing.assert_close(out, widened, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.double(), _reference(query, key_cache, value_cache, *rest, 0.125, window),
                               atol=TOLERANCE[torch.float32], rtol=0)


def test_large_scores_stay_finite() -> None:
    """Scores in the hundreds: the running max keeps every exponent <= 0."""
    query, key_cache, value_cache, tables, starts, lens = _step(torch.float32, 4, 2, 64, 16, [90], [40], seed=3)
    out = NativePagedPrefill()(query * 30, key_cache * 30, value_cache, tables, starts, lens, 1.0, 0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _reference(query * 30, key_cache * 30, value_cache, tables, starts, lens,
                                                        1.0, 0), atol=1e-4, rtol=0)


def test_refuses_what_it_cannot_do() -> None:
    assert supports(torch.float32, 9, 3, 64, 16) and supports(torch.bfloat16, 8, 8, 128, 32)
    assert not supports(torch.float16, 9, 3, 64, 16)
    assert supports(torch.float32, 9, 3, 64, 16, torch.float16) and not supports(torch.bfloat16, 9, 3, 64, 16,
                                                                                    torch.float16)
    assert not supports(torch.float32, 9, 3, 72, 16)  # head size not a multiple of 16
    assert not supports(torch.float32, 9, 3, 64, 8)  # blocks smaller than a 16-key piece
    assert not supports(torch.float32, 9, 3, 256, 16)
    step = _step(torch.float32, 9, 3, 64, 16, [20], [20])
    with pytest.raises(ValueError, match="no C prefill kernel"):
        NativePagedPrefill()(step[0].half(), *step[1:], 0.125, 0)
    with pytest.raises(ValueError, match="query_starts"):
        NativePagedPrefill()(step[0], step[1], step[2], step[3], torch.tensor([0, 5], dtype=torch.int32), step[5],
                             0.125, 0)
