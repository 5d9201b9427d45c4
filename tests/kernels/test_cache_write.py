"""cache_write against the reference: exact copies, negative slots skipped, other slots untouched."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.cache_write import cache_write
from tests.kernels.reference import cache_write_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_cache_write_matches_reference(dtype: torch.dtype, block_size: int, head_dim: int,
                                       device: torch.device) -> None:
    gen = torch.Generator().manual_seed(block_size + head_dim)
    num_blocks, num_kv_heads, num_tokens = 6, 2, 24
    # Key/value are column slices of one fused projection, as a model's qkv split produces them.
    fused = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=gen).to(dtype=dtype, device=device)
    key, value = fused[:, :num_kv_heads], fused[:, num_kv_heads:2 * num_kv_heads]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding rows: must not be stored anywhere
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    value_cache = torch.randn(key_cache.shape, generator=gen).to(dtype)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    cache_write_ref(key.cpu(), value.cpu(), expected_k, expected_v, slots.tolist())

    key_cache, value_cache = key_cache.to(device), value_cache.to(device)
    cache_write(key, value, key_cache, value_cache, slots.to(device))

    assert torch.equal(key_cache.cpu(), expected_k)
    assert torch.equal(value_cache.cpu(), expected_v)


def test_cache_write_all_slots_skipped_leaves_cache_unchanged(device: torch.device) -> None:
    key = torch.randn(3, 1, 64, device=device)
    key_cache = torch.zeros(2, 16, 1, 64, device=device)
    value_cache = torch.zeros_like(key_cache)
    cache_write(key, key, key_cache, value_cache, torch.full((3,), -1, dtype=torch.int64, device=device))
    assert key_cache.count_nonzero().item() == 0 and value_cache.count_nonzero().item() == 0
