"""cache_write into a float8_e4m3fn cache: the stored bits are torch's e4m3 conversion of value / scale, saturated."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.cache_write import cache_write

FP8 = torch.float8_e4m3fn


def _torch_e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (x.float() / scale).clamp(-448.0, 448.0).to(FP8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("k_scale", "v_scale"), [(1.0, 1.0), (0.75, 1.5), (0.01, 3.0)])
def test_fp8_cache_write_round_trip_is_torchs_conversion(dtype: torch.dtype, k_scale: float, v_scale: float,
                                                          device: torch.device) -> None:
    """Every written slot holds torch's bits (including saturated and subnormal values); skipped slots keep theirs."""
    gen = torch.Generator().manual_seed(3)
    num_blocks, block_size, num_kv_heads, head_dim, num_tokens = 5, 16, 2, 64, 40
    # Magnitudes from 1e-4 (subnormal e4m3 after scaling) to 3e3 (past 448: saturates).
    spread = torch.logspace(-4, 3.5, num_tokens * num_kv_heads * head_dim).reshape(num_tokens, num_kv_heads, head_dim)
    key = (torch.randn(spread.shape, generator=gen).sign() * spread).to(dtype)
    value = (torch.randn(spread.shape, generator=gen) * 100).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::7] = -1
    noise = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    key_cache, value_cache = noise.to(FP8), (noise * 2).to(FP8)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected_k[slot // block_size, slot % block_size] = _torch_e4m3(key[t], k_scale)
            expected_v[slot // block_size, slot % block_size] = _torch_e4m3(value[t], v_scale)
    assert (expected_k.float().abs() == 448).any() and (expected_k.float().abs() < 2**-6).any()

    key_cache, value_cache = key_cache.to(device), value_cache.to(device)
    cache_write(key.to(device), value.to(device), key_cache, value_cache, slots.to(device), k_scale, v_scale)

    assert key_cache.dtype == FP8
    assert torch.equal(key_cache.cpu().view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.cpu().view(torch.uint8), expected_v.view(torch.uint8))
    # Read back: the dequantized values are what attention sees.
    written = slots[slots >= 0]
    back = key_cache.cpu().view(-1, num_kv_heads, head_dim)[written].float() * k_scale
    assert torch.equal(back, _torch_e4m3(key[slots >= 0], k_scale).float() * k_scale)


def test_fp8_encoding_rounds_every_e4m3_tie_and_carry_like_torch(device: torch.device) -> None:
    """Each code's value, the midpoints between neighbours (ties to even) and points just either side of them."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(FP8).float()  # 0 .. 448, NaN (0x7F) excluded
    mids = (codes[1:] + codes[:-1]) / 2
    values = torch.cat([codes, mids, mids.nextafter(torch.tensor(0.0)), mids.nextafter(torch.tensor(1e9)),
                        torch.tensor([448.0, 464.0, 1e6, float("inf")])])
    values = torch.cat([values, -values])
    rows = values.numel() // 64 + 1
    key = torch.zeros(rows * 64)
    key[: values.numel()] = values
    key = key.view(rows, 1, 64)
    cache = torch.zeros(1, rows, 1, 64, dtype=FP8, device=device)
    cache_write(key.to(device), key.to(device), cache, torch.zeros_like(cache), torch.arange(rows, device=device))
    expected = key.clamp(-448, 448).to(FP8).view(1, rows, 1, 64)
    assert torch.equal(cache.cpu().view(torch.uint8), expected.view(torch.uint8))
