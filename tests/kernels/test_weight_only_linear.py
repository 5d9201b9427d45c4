"""The weight-only Triton GEMMs (kernels/weight_only_linear.py) against F.linear over the same weights dequantized
(Int4Weight.dequantize / FP8Weight.dequantize, themselves checked against the grid's and torch's float8 arithmetic):
int4 over several group counts, odd output sizes, with and without bias; FP8 with per-tensor and per-channel
scales; every e4m3 bit pattern decoded exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.kernels.weight_only_formats import FP8Weight, Int4Weight, concat_fp8
from pagedserve.kernels.weight_only_linear import fp8_linear, int4_linear
from tests.kernels.tolerances import TOLERANCES

E4M3_NANS = (0x7F, 0xFF)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _grid(out_features: int, in_features: int, seed: int) -> WeightGrid:
    """A random 4-bit grid with fp16-valued scales and GPTQ-like offsets (-zero * scale)."""
    gen = _gen(seed)
    groups = in_features // 32
    scales = (torch.rand(out_features, groups, generator=gen) * 0.1 + 0.01).half().float()
    zeros = torch.randint(0, 16, (out_features, groups), generator=gen).float()
    codes = torch.randint(0, 16, (out_features, in_features), generator=gen).to(torch.uint8)
    return WeightGrid(codes, scales, -zeros * scales, 4)


def _fp8(out_features: int, in_features: int, per_channel: bool, seed: int) -> FP8Weight:
    gen = _gen(seed)
    weight = (torch.randn(out_features, in_features, generator=gen) * 64).to(torch.float8_e4m3fn)
    shape = (out_features, 1) if per_channel else (1,)
    return FP8Weight.from_fp8(weight, torch.rand(*shape, generator=gen) * 0.01 + 1e-3)


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: summation order only. Half types: the reference rounds the weights as the kernel does, so the
    output rounding (and the interpreter's bf16 truncation: twice the bound) is what remains."""
    atol, rtol = TOLERANCES[dtype]
    factor = 2 if dtype == torch.bfloat16 and out.device.type == "cpu" else 1
    scale = max(1.0, ref.abs().max().item())
    assert out.dtype == dtype
    torch.testing.assert_close(out.float().cpu(), ref.cpu(), atol=atol * factor * scale, rtol=rtol * factor)


def test_int4_packing_round_trips_the_grid() -> None:
    grid = _grid(5, 64, seed=1)
    packed = Int4Weight.from_grid(grid)
    assert packed.packed.dtype == torch.uint8 and packed.packed.shape == (5, 32) and packed.shape == (5, 64)
    assert torch.equal(packed.packed[:, 3] & 15, grid.codes[:, 6]) and torch.equal(packed.packed[:, 3] >> 4,
                                                                                  grid.codes[:, 7])
    expected = (grid.codes.float().view(5, 2, 32) * grid.scales.unsqueeze(-1) + grid.offsets.unsqueeze(-1))
    assert torch.equal(packed.dequantize(), expected.view(5, 64))


def test_int4_refuses_other_grids() -> None:
    grid = _grid(4, 32, seed=2)
    with pytest.raises(ValueError, match="4-bit codes over groups of 32"):
        Int4Weight.from_grid(WeightGrid(grid.codes.to(torch.int8), grid.scales, grid.offsets, 8))


@pytest.mark.parametrize("rows,out_features,in_features", [(1, 37, 32), (3, 64, 96), (5, 129, 256),
                                                           (17, 33, 160), (40, 70, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_int4_linear_matches_the_dequantized_reference(device, rows, out_features, in_features, with_bias) -> None:
    weight = Int4Weight.from_grid(_grid(out_features, in_features, seed=out_features))
    gen = _gen(rows)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    ref = F.linear(x, weight.dequantize(), bias)
    out = int4_linear(x.to(device), weight.to(device), None if bias is None else bias.to(device))
    _close(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_int4_linear_in_half_precision(device, dtype) -> None:
    weight = Int4Weight.from_grid(_grid(45, 128, seed=3))
    x = torch.randn(4, 128, generator=_gen(4)).to(dtype)
    bias = torch.randn(45, generator=_gen(5)).to(dtype)
    ref = F.linear(x.float(), weight.dequantize(dtype).float(), bias.float())
    _close(int4_linear(x.to(device), weight.to(device), bias.to(device)), ref, dtype)


def test_int4_linear_reads_strided_rows(device) -> None:
    weight = Int4Weight.from_grid(_grid(40, 64, seed=6)).to(device)
    wide = torch.randn(3, 80, generator=_gen(7)).to(device)
    _close(int4_linear(wide[:, 8:72], weight), F.linear(wide[:, 8:72].cpu(), weight.dequantize().cpu()),
           torch.float32)


def test_linear_refuses_a_mismatched_input(device) -> None:
    weight = Int4Weight.from_grid(_grid(8, 64, seed=14)).to(device)
    with pytest.raises(ValueError, match=r"is not \[rows, 64\]"):
        int4_linear(torch.zeros(2, 32, device=device), weight)


def test_fp8_dequantize_is_torchs_float8_arithmetic() -> None:
    weight = (torch.randn(6, 40, generator=_gen(8)) * 30).to(torch.float8_e4m3fn)
    scale = torch.rand(6, 1, generator=_gen(9))
    assert torch.equal(FP8Weight.from_fp8(weight, scale).dequantize(), weight.float() * scale)
    assert torch.equal(FP8Weight.from_fp8(weight, scale[0, 0]).dequantize(), weight.float() * scale[0, 0])
    with pytest.raises(ValueError, match="per-tensor or per-row"):
        FP8Weight.from_fp8(weight, torch.ones(2, 2))


def test_fp8_kernel_decodes_every_e4m3_bit_pattern_exactly(device) -> None:
    """x = identity picks each weight out alone: the kernel's decode of all 254 finite patterns, bit for bit."""
    bits = torch.arange(256, dtype=torch.int32)
    bits[list(E4M3_NANS)] = 0
    weight = FP8Weight(bits.to(torch.uint8).view(2, 128), torch.ones(2))
    out = fp8_linear(torch.eye(128).to(device), weight.to(device))
    assert torch.equal(out.T.cpu(), weight.dequantize())


def test_fp8_concat_keeps_each_rows_scale() -> None:
    a, b = _fp8(3, 32, True, seed=10), _fp8(2, 32, False, seed=11)
    assert torch.equal(concat_fp8([a, b]).dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("rows,out_features,in_features", [(1, 37, 32), (4, 64, 100), (18, 129, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_linear_matches_the_dequantized_reference(device, per_channel, rows, out_features, in_features,
                                                      with_bias) -> None:
    weight = _fp8(out_features, in_features, per_channel, seed=in_features)
    gen = _gen(rows)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    ref = F.linear(x, weight.dequantize(), bias)
    out = fp8_linear(x.to(device), weight.to(device), None if bias is None else bias.to(device))
    _close(out, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_linear_in_half_precision(device, dtype) -> None:
    weight = _fp8(45, 96, True, seed=12)
    x = torch.randn(3, 96, generator=_gen(13)).to(dtype)
    ref = F.linear(x.float(), weight.dequantize())  # e4m3 values are exact in fp16 and bf16
    _close(fp8_linear(x.to(device), weight.to(device)), ref, dtype)
