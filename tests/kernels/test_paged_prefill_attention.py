"""paged_prefill_attention against the reference: mixed chunk lengths, cached prefixes, GQA, head and block sizes."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_prefill_attention import paged_prefill_attention
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref


def _run(batch: PagedBatch, scale: float, window: int | None = None) -> torch.Tensor:
    return paged_prefill_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                                   batch.seq_lens, batch.query_start_loc, scale, batch.max_query_len,
                                   sliding_window=window)


def _ref(batch: PagedBatch, scale: float, window: int | None = None) -> torch.Tensor:
    return paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                               batch.seq_lens_cpu, batch.query_start_loc_cpu, scale, window)


def _mixed_lens(block_size: int) -> tuple[list[int], list[int]]:
    """(seq_lens, query_lens): a fresh prompt, chunks after cached prefixes of several shapes, one long chunk."""
    requests = [
        (37, 37),  # whole prompt, nothing cached
        (3 * block_size + 1, block_size + 1),  # chunk after a two-block cached prefix, crossing a block edge
        (block_size, 1),  # one token after block_size - 1 cached ones, ending exactly on a block edge
        (300, 150),  # several hundred positions, many query tiles, half of them cached
    ]
    return [s for s, _ in requests], [q for _, q in requests]


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_fp32_grid(group: int, head_dim: int, block_size: int, device: torch.device) -> None:
    num_kv_heads = 1 if group == 8 else 2
    seq_lens, query_lens = _mixed_lens(block_size)
    batch = make_batch(seq_lens, query_lens, group * num_kv_heads, num_kv_heads, head_dim, block_size,
                       torch.float32, device, seed=group + head_dim + block_size)
    scale = head_dim**-0.5
    assert_close_to_ref(_run(batch, scale), _ref(batch, scale), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_half_precision(dtype: torch.dtype, device: torch.device) -> None:
    seq_lens, query_lens = _mixed_lens(16)
    batch = make_batch(seq_lens, query_lens, 8, 2, 128, 16, dtype, device, seed=5)
    assert_close_to_ref(_run(batch, 128**-0.5), _ref(batch, 128**-0.5), dtype)


def test_prefill_head_dim_256(device: torch.device) -> None:
    seq_lens, query_lens = _mixed_lens(32)
    batch = make_batch(seq_lens, query_lens, 4, 2, 256, 32, torch.float32, device, seed=6)
    assert_close_to_ref(_run(batch, 256**-0.5), _ref(batch, 256**-0.5), torch.float32)


@pytest.mark.parametrize("group", [1, 4])
def test_prefill_sliding_window(group: int, device: torch.device) -> None:
    # A window of 20 is shorter than a query tile for group 1 (64 tokens) and longer for group 4 (16 tokens).
    seq_lens, query_lens = _mixed_lens(16)
    batch = make_batch(seq_lens, query_lens, group, 1, 64, 16, torch.float32, device, seed=9)
    assert_close_to_ref(_run(batch, 0.125, window=20), _ref(batch, 0.125, window=20), torch.float32)


def test_prefill_leaves_rows_of_other_requests_untouched(device: torch.device) -> None:
    # first_req / num_reqs select requests 1..2; request 0's row and any rows past the batch keep their values.
    batch = make_batch([9, 20, 40], [1, 20, 8], 4, 2, 64, 16, torch.float32, device, seed=4)
    out = torch.full_like(batch.query, 7.0)
    paged_prefill_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                            batch.query_start_loc, 0.125, 20, first_req=1, num_reqs=2, out=out)
    ref = _ref(batch, 0.125)
    assert torch.equal(out[0].cpu(), torch.full_like(out[0].cpu(), 7.0))
    assert_close_to_ref(out[1:], ref[1:], torch.float32)
