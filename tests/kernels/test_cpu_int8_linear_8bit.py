"""The C int8 GEMM on 8-bit grid weights (kernels/cpu/int8_linear.c: GGUF Q5_0 / Q5_1 / Q5_K / Q8_0 / Q6_K codes)
against a float64 model of its scheme and against the exact product; its AVX2 path (built without AVX512-VNNI)
against the one this CPU runs (the avx2_kernel fixture: conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from pagedserve.kernels.cpu.int8_linear import PANEL, Int8Linear, pack_grid, supports
from pagedserve.kernels.cpu.weight_grid import WeightGrid, find_grid
from pagedserve.services.gpu_worker.gguf.blocks import grid_from_blocks
from tests.kernels.test_cpu_int8_linear import quantized_rows
from tests.kernels.test_cpu_packed_linear import grid_weight


def random_grid(out_features: int, in_features: int, group: int, offsets: bool, seed: int = 0) -> WeightGrid:
    """Codes over the whole int8 range (-128 included), fp16-exact scales, and offsets or none (Q5_0/Q8_0/Q6_K)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (out_features, in_features), generator=g).to(torch.int8)
    shape = (out_features, in_features // group)
    scales = (torch.rand(shape, generator=g) * 1e-3 + 1e-4).half().float()
    shift = (torch.randn(shape, generator=g) * 0.02).half().float() if offsets else torch.zeros(shape)
    return WeightGrid(codes, scales, shift, 8, group)


def dequantized(grid: WeightGrid) -> torch.Tensor:
    """The grid's weights [out, in] in float64 (exact: codes times fp16-exact scales need few bits)."""
    expand = grid.codes.shape[1] // grid.scales.shape[1]
    return (grid.codes.double() * grid.scales.double().repeat_interleave(expand, 1)
            + grid.offsets.double().repeat_interleave(expand, 1))


def reference(x: torch.Tensor, grid: WeightGrid, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The scheme in float64: per weight group, s * (scale * (c . a) + offset * sum(a)) with the activation scale s
    of the 32 inputs holding it, plus each outlier input x its weight column."""
    codes, scales, outlier, place = (t.double() for t in quantized_rows(x))
    rows, group = x.shape[0], grid.group
    a = codes.reshape(rows, -1, group)  # [rows, K, group] over the weight groups
    s = scales.repeat_interleave(32 // group, 1)  # [rows, K]
    c = grid.codes.double().view(grid.codes.shape[0], -1, group)
    dots = torch.einsum("rkg,ckg->rck", a, c)
    out = (s[:, None] * (dots * grid.scales.double() + grid.offsets.double() * a.sum(-1)[:, None])).sum(-1)
    weight = dequantized(grid)  # [out, in]
    index = (torch.arange(place.shape[1]) * 32)[None] + place.long()  # [rows, G]
    out = out + (outlier[..., None] * weight.T[index]).sum(1)
    return out if bias is None else out + bias.double()


def test_packing_layout() -> None:
    """Byte 4j + i of quad t holds column j's input 4t + i; columns past the last are zero codes and scales."""
    grid = random_grid(30, 64, 16, offsets=True)
    packed = pack_grid(grid)
    assert (packed.bits, packed.group) == (8, 16)
    assert packed.codes.shape == (2, 16, 64) and packed.codes.dtype == torch.int8
    assert packed.scales.shape == packed.offsets.shape == (2, 4, PANEL)
    k, j = 41, 3
    assert packed.codes[1, k // 4, 4 * j + k % 4] == grid.codes[PANEL + j, k]
    assert packed.scales[1, k // 16, j] == grid.scales[PANEL + j, k // 16]
    assert not packed.codes[1, :, 4 * 14:].any() and not packed.scales[1, :, 14:].any()  # columns 30, 31


@pytest.mark.parametrize("rows", [1, 3, 5, 8, 9, 16, 97])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 192), (96, 33)])
@pytest.mark.parametrize(("group", "offsets"), [(32, False), (32, True), (16, False), (16, True)])
def test_matches_the_scheme(rows: int, in_features: int, out_features: int, group: int, offsets: bool) -> None:
    grid = random_grid(out_features, in_features, group, offsets, seed=rows)
    torch.manual_seed(rows + in_features)
    x = torch.randn(rows, in_features) * torch.rand(1, in_features) * 4  # uneven channels: some outliers
    b = torch.randn(out_features) if rows % 2 else None
    out = Int8Linear()(x, pack_grid(grid), b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(x, grid, b), atol=1e-4, rtol=1e-5)
    exact = x.double() @ dequantized(grid).T + (0 if b is None else b.double())
    assert (out.double() - exact).norm() < 0.02 * exact.norm()  # int8 inputs: within 2% of the exact product


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1])
def test_a_gguf_weight_within_one_percent_of_its_fp32_product(qtype: GGMLQuantizationType) -> None:
    """A weight as the gguf package quantizes it, read from its blocks as the GGUF loader does (8-bit codes),
    against inputs with an outlier channel, as the default model has."""
    values = np.random.default_rng(0).standard_normal((96, 576)).astype(np.float32) * 0.05
    blocks = quantize(values, qtype)
    grid = grid_from_blocks(blocks, qtype, 96, 576)
    weight = torch.from_numpy(dequantize(blocks, qtype).copy())
    assert grid.bits == 8 and supports(grid) and torch.equal(dequantized(grid).float(), weight)
    torch.manual_seed(1)
    x = torch.randn(16, 576)
    x[:, 7] = 300.0
    out = Int8Linear()(x, pack_grid(grid), None)
    exact = x.double() @ weight.double().T
    assert (out.double() - exact).norm() < 0.01 * exact.norm()
    torch.testing.assert_close(out.double(), reference(x, grid), atol=1e-3, rtol=1e-5)


def test_each_row_is_the_same_whatever_the_row_count() -> None:
    grid = random_grid(100, 704, 16, offsets=True, seed=3)
    torch.manual_seed(3)
    x = torch.randn(150, 704)
    kernel, packed = Int8Linear(), pack_grid(grid)
    whole = kernel(x, packed, None)
    for start, stop in ((0, 1), (7, 20), (90, 150), (149, 150)):
        assert torch.equal(kernel(x[start:stop], packed, None), whole[start:stop])


@pytest.mark.parametrize(("bits", "group"), [(4, 32), (8, 32), (8, 16)])
@pytest.mark.parametrize("rows", [1, 4, 7, 16, 100])
def test_the_avx2_path_gives_the_same_bits(avx2_kernel: Int8Linear, bits: int, group: int, rows: int) -> None:
    """Both paths sum the same exact integers and scale them in the same fp32 operations."""
    if bits == 4:
        grid = find_grid(grid_weight(72, 576, GGMLQuantizationType.Q4_1))
    else:
        grid = random_grid(72, 576, group, offsets=True, seed=rows)
    torch.manual_seed(rows)
    x = torch.randn(rows, 576) * torch.rand(1, 576) * 4
    packed, bias = pack_grid(grid), torch.randn(72)
    assert torch.equal(avx2_kernel(x, packed, bias), Int8Linear()(x, packed, bias))


def test_refuses_what_it_cannot_do() -> None:
    grid = random_grid(16, 64, 16, offsets=False)
    assert not supports(WeightGrid(grid.codes, grid.scales[:, ::2].contiguous(), grid.offsets[:, ::2], 8, 32 * 2))
    assert not supports(WeightGrid(grid.codes[:, :48], grid.scales[:, :3], grid.offsets[:, :3], 8, 16))
    with pytest.raises(ValueError, match="8-bit ones of 16 or 32"):
        pack_grid(WeightGrid(grid.codes, grid.scales[:, ::4].contiguous(), grid.offsets[:, ::4], 8, 64))
    with pytest.raises(ValueError, match="no C int8 linear"):
        Int8Linear()(torch.randn(2, 32), pack_grid(grid), None)
