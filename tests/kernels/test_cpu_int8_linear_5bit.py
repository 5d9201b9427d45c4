"""The C int8 GEMM on 5-bit codes (kernels/cpu/int8_linear.c: GGUF Q5_0 / Q5_1 / Q5_K grids, nibbles plus a plane
of fifth bits): the layout decoded back to the codes, and the outputs bit for bit those of the same grid packed as
8-bit codes, on the AVX512-VNNI path this CPU runs and on the AVX2 path (the avx2_kernel fixture: conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from pagedserve.kernels.cpu.int8_linear import (
    FIVE_BIT_GROUP_BYTES,
    PANEL,
    Int8Linear,
    Int8Weight,
    five_bit_base,
    pack_grid,
)
from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.services.gpu_worker.gguf.blocks import grid_from_blocks
from tests.kernels.test_cpu_int8_linear_8bit import dequantized, reference
from tests.unit.gpu_worker.tiny_gguf import quantize


def five_bit_grid(out_features: int, in_features: int, base: int, seed: int = 0) -> WeightGrid:
    """Codes over the whole 5-bit range from `base` (-16: Q5_0, offsets zero; 0: Q5_1 / Q5_K, with offsets)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(base, base + 32, (out_features, in_features), generator=g).to(torch.int8)
    shape = (out_features, in_features // 32)
    scales = (torch.rand(shape, generator=g) * 1e-2 + 1e-3).half().float()
    offsets = (torch.randn(shape, generator=g) * 0.05).half().float() if base == 0 else torch.zeros(shape)
    return WeightGrid(codes, scales, offsets, 8, 32)


def unpacked_codes(weight: Int8Weight) -> torch.Tensor:
    """The codes [panels * 16, in] that a 5-bit packing holds, read back by the layout's description."""
    panels, groups = weight.codes.shape[:2]
    nibbles = weight.codes[..., :256].reshape(panels, groups * 8, 8, 4)  # [panel, quad, column j < 8, input]
    low = torch.cat((nibbles & 15, nibbles >> 4), dim=2)  # [panel, quad, column 0-15, input]
    words = weight.codes[..., 256:].reshape(panels, groups * 8, 8)  # [panel, quad, byte]
    bits = ((words.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(panels, groups * 8, 16, 4)
    stored = low.to(torch.int16) | (bits.to(torch.int16) << 4)  # bit 4j + i: column j, input i
    return (stored + weight.base).permute(0, 2, 1, 3).reshape(panels * PANEL, groups * 32)


@pytest.mark.parametrize("base", [-16, 0])
def test_packing_round_trip(base: int) -> None:
    grid = five_bit_grid(30, 96, base)
    packed = pack_grid(grid)
    assert (packed.bits, packed.group, packed.base) == (5, 32, base)
    assert packed.codes.shape == (2, 3, FIVE_BIT_GROUP_BYTES) and packed.codes.dtype == torch.uint8
    assert packed.scales.shape == packed.offsets.shape == (2, 3, PANEL)
    codes = unpacked_codes(packed)
    assert torch.equal(codes[:30], grid.codes.to(torch.int16))
    assert torch.equal(codes[30:], torch.full((2, 96), base, dtype=torch.int16))  # padding: stored zeros
    assert packed.codes.numel() * 8 == 5 * 32 * 96  # 5 bits a weight (two whole panels)


def test_which_grids_take_5_bits() -> None:
    assert five_bit_base(five_bit_grid(16, 64, -16)) == -16
    assert five_bit_base(five_bit_grid(16, 64, 0)) == 0
    narrow = five_bit_grid(16, 64, 0)
    assert five_bit_base(WeightGrid(narrow.codes[:, :32] // 2, narrow.scales[:, :1], narrow.offsets[:, :1], 8,
                                    32)) == -16  # [0, 15]: both fit, the first base is taken
    for codes in (narrow.codes + 1, narrow.codes - 17, narrow.codes - 10):  # [1, 32], [-17, 14], [-10, 21]
        assert five_bit_base(WeightGrid(codes, narrow.scales, narrow.offsets, 8, 32)) is None
        assert pack_grid(WeightGrid(codes, narrow.scales, narrow.offsets, 8, 32)).bits == 8
    halves = WeightGrid(narrow.codes, narrow.scales.repeat_interleave(2, 1), narrow.offsets.repeat_interleave(2, 1),
                        8, 16)
    assert five_bit_base(halves) is None  # groups of 16 (Q6_K) stay 8-bit
    four = WeightGrid(narrow.codes.to(torch.uint8) & 15, narrow.scales, narrow.offsets, 4, 32)
    assert five_bit_base(four) is None and pack_grid(four).bits == 4
    assert pack_grid(narrow, five_bit=False).bits == 8


def _inputs(rows: int, in_features: int, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randn(rows, in_features) * torch.rand(1, in_features) * 4  # uneven channels
    x[:, 5] = 300.0  # an outlier channel: kept in fp32 and added from the codes' weights
    x[::3, in_features - 2] = -900.0
    return x


@pytest.mark.parametrize("base", [-16, 0])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (96, 33), (576, 192), (32, 7)])
def test_5_bit_codes_give_the_8_bit_codes_bits(avx2_kernel: Int8Linear, base: int, in_features: int,
                                               out_features: int) -> None:
    """Rows 1-40 with and without bias, both paths: the same integers scaled the same way."""
    grid = five_bit_grid(out_features, in_features, base, seed=in_features + out_features)
    five, eight = pack_grid(grid), pack_grid(grid, five_bit=False)
    assert (five.bits, eight.bits) == (5, 8)
    kernel = Int8Linear()
    x_all = _inputs(40, in_features, seed=out_features)
    for rows in range(1, 41):
        x = x_all[:rows]
        bias = torch.randn(out_features) if rows % 2 else None
        expected = kernel(x, eight, bias)
        assert torch.equal(kernel(x, five, bias), expected), rows
        assert torch.equal(avx2_kernel(x, five, bias), expected), rows
        assert torch.equal(avx2_kernel(x, eight, bias), expected), rows
    torch.testing.assert_close(expected.double(), reference(x_all, grid, bias), atol=1e-4, rtol=1e-5)


def test_extreme_codes_and_inputs(avx2_kernel: Int8Linear) -> None:
    """Every code at either end of its range against inputs at +-127 after quantization: no 16-bit pair sum
    saturates on AVX2 (31 * 127 * 2 at most)."""
    for base in (-16, 0):
        codes = torch.full((48, 128), base + 31, dtype=torch.int8)
        codes[::2] = base
        codes[:, ::5] = base + 31
        grid = WeightGrid(codes, torch.full((48, 4), 0.5), torch.full((48, 4), 0.25 if base == 0 else 0.0), 8, 32)
        x = torch.full((9, 128), 2.0)
        x[1::2] = -2.0
        x[4, 3] = -2.5
        expected = Int8Linear()(x, pack_grid(grid, five_bit=False), None)
        for kernel in (Int8Linear(), avx2_kernel):
            assert torch.equal(kernel(x, pack_grid(grid), None), expected)
        exact = x.double() @ dequantized(grid).T  # rows of +-2 only: inputs exact in int8 (row 4 is rounded)
        rows = [r for r in range(9) if r != 4]
        torch.testing.assert_close(expected[rows].double(), exact[rows], atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize(("qtype", "base"), [(T.Q5_0, -16), (T.Q5_1, 0), (T.Q5_K, 0)], ids=["Q5_0", "Q5_1", "Q5_K"])
def test_a_gguf_weight_takes_5_bits_and_the_same_outputs(avx2_kernel: Int8Linear, qtype: T,
                                                         base: int) -> None:
    """A weight quantized as ggml does (K-quants: the tests' encoder), read from its blocks as the loader does,
    against inputs with an outlier channel, as the default model has."""
    values = np.random.default_rng(int(qtype)).standard_normal((96, 768)).astype(np.float32) * 0.05
    blocks = quantize(values, qtype)
    grid = grid_from_blocks(blocks, qtype, 96, 768)
    weight = torch.from_numpy(dequantize(blocks, qtype).copy())
    assert torch.equal(dequantized(grid).float(), weight)
    five, eight = pack_grid(grid), pack_grid(grid, five_bit=False)
    assert (five.bits, five.base) == (5, base)
    torch.manual_seed(1)
    x = torch.randn(16, 768)
    x[:, 7] = 300.0
    out = Int8Linear()(x, five, None)
    assert torch.equal(out, Int8Linear()(x, eight, None)) and torch.equal(avx2_kernel(x, five, None), out)
    exact = x.double() @ weight.double().T
    assert (out.double() - exact).norm() < 0.01 * exact.norm()


def test_each_row_is_the_same_whatever_the_row_count() -> None:
    packed = pack_grid(five_bit_grid(100, 704, -16, seed=3))
    x = _inputs(150, 704, seed=3)
    kernel = Int8Linear()
    whole = kernel(x, packed, None)
    for start, stop in ((0, 1), (7, 20), (90, 150), (149, 150)):
        assert torch.equal(kernel(x[start:stop], packed, None), whole[start:stop])


def test_refuses_5_bit_codes_in_groups_of_16() -> None:
    packed = pack_grid(five_bit_grid(16, 64, -16))
    wrong = Int8Weight(16, 64, packed.codes, packed.scales, packed.offsets, 5, 16, -16)
    with pytest.raises(ValueError, match="no 5-bit codes in groups of 16"):
        Int8Linear()(torch.randn(2, 64), wrong, None)
