"""paged_decode_attention against the reference, single-pass and split-K, across GQA, head and block sizes."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.paged_decode_attention import (
    DecodeWorkspace,
    choose_num_splits,
    paged_decode_attention,
    plan_splits,
    workspace_rows,
)
from tests.kernels.paged_batch import PagedBatch, make_batch
from tests.kernels.reference import paged_attention_ref
from tests.kernels.tolerances import assert_close_to_ref


def _run(batch: PagedBatch, scale: float, window: int | None, partition_size: int | None) -> torch.Tensor:
    return paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                                  scale, max(batch.seq_lens_cpu), sliding_window=window, partition_size=partition_size)


def _ref(batch: PagedBatch, scale: float, window: int | None = None) -> torch.Tensor:
    return paged_attention_ref(batch.query, batch.key_cache, batch.value_cache, batch.block_tables,
                               batch.seq_lens_cpu, batch.query_start_loc_cpu, scale, window)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128, 96])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_fp32_grid(group: int, head_dim: int, block_size: int, device: torch.device) -> None:
    num_kv_heads = 1 if group == 8 else 2
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 300]  # partial, exact and one-over last blocks
    batch = make_batch(seq_lens, [1] * len(seq_lens), group * num_kv_heads, num_kv_heads, head_dim, block_size,
                       torch.float32, device, seed=group + head_dim + block_size)
    scale = head_dim**-0.5
    ref = _ref(batch, scale)
    assert plan_splits(len(seq_lens) * num_kv_heads, head_dim, 300, device, 64).num_splits == 5
    assert_close_to_ref(_run(batch, scale, None, None), ref, torch.float32)
    assert_close_to_ref(_run(batch, scale, None, 64), ref, torch.float32)  # split-K + reduce


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("partition_size", [None, 32])
def test_decode_half_precision(dtype: torch.dtype, partition_size: int | None, device: torch.device) -> None:
    batch = make_batch([1, 17, 300], [1, 1, 1], 8, 2, 128, 16, dtype, device, seed=7)
    assert_close_to_ref(_run(batch, 128**-0.5, None, partition_size), _ref(batch, 128**-0.5), dtype)


@pytest.mark.parametrize("partition_size", [None, 64])
def test_decode_head_dim_256(partition_size: int | None, device: torch.device) -> None:
    # The largest head size: 32-token tiles; a forced 64-token partition still splits 300 positions 5 ways.
    batch = make_batch([5, 300], [1, 1], 4, 2, 256, 32, torch.float32, device, seed=13)
    assert_close_to_ref(_run(batch, 256**-0.5, None, partition_size), _ref(batch, 256**-0.5), torch.float32)


@pytest.mark.parametrize("partition_size", [None, 32])
def test_decode_sliding_window(partition_size: int | None, device: torch.device) -> None:
    # Windows shorter and longer than the context; with splits, the window start is not tile-aligned.
    batch = make_batch([1, 40, 45, 300], [1] * 4, 4, 1, 64, 16, torch.float32, device, seed=3)
    ref = _ref(batch, 0.125, window=50)
    assert_close_to_ref(_run(batch, 0.125, 50, partition_size), ref, torch.float32)


def test_decode_long_split_context_matches_unsplit(device: torch.device) -> None:
    # Many splits, most requests shorter than the longest: their trailing splits are empty and must weigh 0.
    batch = make_batch([700, 33, 1], [1] * 3, 2, 1, 64, 32, torch.float32, device, seed=11)
    assert plan_splits(3, 64, 700, device, 64).num_splits == 11
    assert_close_to_ref(_run(batch, 0.125, None, 64), _ref(batch, 0.125), torch.float32)


@pytest.mark.parametrize(("num_programs", "max_len", "num_sms", "expected"), [
    (8, 8192, 132, 32),  # one request: 32 splits of MIN_PARTITION fill the device
    (2048, 8192, 132, 1),  # 256 requests x 8 kv heads already fill it: no split
    (64, 8192, 132, 5),  # ceil(264 / 64) = 5 splits
    (8, 100, 132, 1),  # short contexts never split
])
def test_choose_num_splits(num_programs: int, max_len: int, num_sms: int, expected: int) -> None:
    assert choose_num_splits(num_programs, max_len, num_sms) == expected


def test_per_request_splits_with_a_static_bound(device: torch.device) -> None:
    # The launch sees only a static bound (a 64-block table of 16 tokens) and 8 planned splits; each request cuts
    # its own context in the kernel: 1 and 20 tokens use one split, 300 uses two, 1000 uses four.
    batch = make_batch([1, 20, 300, 1000], [1] * 4, 4, 2, 64, 16, torch.float32, device, seed=5)
    tables = torch.zeros(4, 64, dtype=torch.int32, device=device)
    tables[:, : batch.block_tables.shape[1]] = batch.block_tables
    assert plan_splits(8, 64, 1024, device, num_sms=32).num_splits == 4
    out = paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, tables, batch.seq_lens, 0.125,
                                 64 * 16, num_sms=32)
    assert_close_to_ref(out, _ref(batch, 0.125), torch.float32)


def test_workspace_is_reused_and_checked(device: torch.device) -> None:
    batch = make_batch([300, 700], [1, 1], 4, 2, 64, 16, torch.float32, device, seed=9)
    rows = workspace_rows(2, 4, 2, 64, 704, device, num_sms=16)
    assert rows == 2 * 4 * 3
    workspace = DecodeWorkspace.allocate(rows, 64, device)
    workspace.part_max.fill_(float("nan"))  # stale scratch must never leak into an output
    out = paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                                 0.125, 704, workspace=workspace, num_sms=16)
    assert_close_to_ref(out, _ref(batch, 0.125), torch.float32)
    with pytest.raises(ValueError, match="workspace holds"):
        paged_decode_attention(batch.query, batch.key_cache, batch.value_cache, batch.block_tables, batch.seq_lens,
                               0.125, 704, workspace=DecodeWorkspace.allocate(4, 64, device), num_sms=16)
