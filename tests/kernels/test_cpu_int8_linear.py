"""The C int8 GEMM for 4-bit grid weights (kernels/cpu/int8_linear.c) against a float64 model of its scheme (inputs
quantized to int8 per row and 32, outliers kept in fp32), and against the exact product."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from pagedserve.kernels.cpu.int8_linear import PANEL, Int8Linear, pack_grid, supports
from pagedserve.kernels.cpu.weight_grid import WeightGrid, find_grid
from tests.kernels.test_cpu_packed_linear import grid_weight

OUTLIER = 2.0  # int8_linear.c: an input above this times the rest of its group stays in fp32


def quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's quantization: per row and group of 32, (codes [rows, G, 32], scales [rows, G], outlier values
    [rows, G] (0: none), outlier places [rows, G]). The outlier is the first input of the largest magnitude when
    that magnitude is more than OUTLIER times the group's second largest."""
    groups = x.view(x.shape[0], -1, 32)
    magnitude = groups.abs()
    place = magnitude.argmax(-1, keepdim=True)
    largest = magnitude.gather(-1, place).squeeze(-1)
    second = magnitude.scatter(-1, place, 0.0).amax(-1)
    is_outlier = largest > OUTLIER * second
    outlier = torch.where(is_outlier, groups.gather(-1, place).squeeze(-1), torch.zeros_like(largest))
    kept = groups.masked_fill(is_outlier.unsqueeze(-1) & (torch.arange(32) == place), 0.0)
    amax = torch.where(is_outlier, second, largest).unsqueeze(-1)
    inverse = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))  # fp32 division
    codes = torch.round(kept * inverse).clamp(-127, 127)
    return codes, (amax / 127).squeeze(-1), outlier, place.squeeze(-1)


def reference(x: torch.Tensor, grid: WeightGrid, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The scheme in float64: sum over groups of s * scale * (q . a) + offset * s * sum(a), plus outlier x w."""
    codes, scales, outlier, place = (t.double() for t in quantized_rows(x))
    weight_codes = grid.codes.double().view(grid.codes.shape[0], -1, 32)
    weight = weight_codes * grid.scales.double()[..., None] + grid.offsets.double()[..., None]  # [out, G, 32]
    dots = torch.einsum("rgk,cgk->rcg", codes, weight_codes)
    out = (dots * scales[:, None] * grid.scales.double() + grid.offsets.double() * (scales * codes.sum(-1))[:, None])
    columns = weight.permute(1, 2, 0)[torch.arange(codes.shape[1]), place.long()]  # [rows, G, out]
    out = out.sum(-1) + (outlier[..., None] * columns).sum(1)
    return out if bias is None else out + bias.double()


def _grid(out_features: int, in_features: int) -> tuple[torch.Tensor, WeightGrid]:
    weight = grid_weight(out_features, in_features, GGMLQuantizationType.Q4_1)
    grid = find_grid(weight)
    assert supports(grid)
    return weight, grid


def test_packing_layout() -> None:
    """Byte 4j + i of quad t holds column j's input 4t + i (low nibble) and column j + 8's (high); columns past the
    last are zero codes with zero scales."""
    _, grid = _grid(30, 64)
    packed = pack_grid(grid)
    assert packed.codes.shape == (2, 16, 32) and packed.codes.dtype == torch.uint8
    assert packed.scales.shape == packed.offsets.shape == (2, 2, PANEL)
    k, j = 41, 3  # quad 10, place 1; panel 1 holds columns 16-31
    assert packed.codes[1, k // 4, 4 * j + k % 4] == grid.codes[PANEL + j, k] | (grid.codes[PANEL + 8 + j, k] << 4)
    assert packed.scales[1, k // 32, 9] == grid.scales[PANEL + 9, k // 32]
    assert not packed.scales[1, :, 14:].any() and not packed.offsets[1, :, 14:].any()  # columns 30, 31
    assert torch.equal(packed.codes[1, :, 4 * 6:] >> 4, torch.zeros(16, 8, dtype=torch.uint8))  # columns 30, 31


# rows: tiles of 1-6 and every tail, more than one 96-row block; out: whole panels and a partial last one
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 96, 97, 200])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 192), (96, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_scheme(rows: int, in_features: int, out_features: int, bias: bool) -> None:
    weight, grid = _grid(out_features, in_features)
    torch.manual_seed(rows + in_features)
    x = torch.randn(rows, in_features) * torch.rand(1, in_features) * 4  # uneven channels: some outliers
    b = torch.randn(out_features) if bias else None
    out = Int8Linear()(x, pack_grid(grid), b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(x, grid, b), atol=1e-4, rtol=1e-5)
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert (out.double() - exact).norm() < 0.02 * exact.norm()  # int8 inputs: within 2% of the exact product


def test_an_outlier_input_does_not_zero_its_group() -> None:
    """One input 1000x its neighbours (the default model has such channels): kept in fp32, the product stays within
    1% of the exact one; quantized with its group, every neighbour would round to 0."""
    weight, grid = _grid(48, 64)
    torch.manual_seed(5)
    x = torch.randn(3, 64)
    x[:, 7] = 1000.0
    codes, _, outlier, place = quantized_rows(x)
    assert torch.equal(outlier[:, 0], torch.full((3,), 1000.0)) and (place[:, 0] == 7).all()
    assert codes[:, 0].abs().amax(-1).eq(127).all()  # the others use the whole int8 range
    out = Int8Linear()(x, pack_grid(grid), None)
    exact = x.double() @ weight.double().T
    assert (out.double() - exact).norm() < 0.01 * exact.norm()
    torch.testing.assert_close(out.double(), reference(x, grid), atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_outliers_in_many_channels_over_whole_and_partial_strips(threads: int) -> None:
    """Every group of every row keeps an outlier, in channels that some rows share and some do not, through 1,000
    columns: whole 64-column strips of the outlier pass and a partial last one (and a partial last panel)."""
    weight, grid = _grid(1000, 128)
    torch.manual_seed(11)
    x = torch.randn(100, 128)
    rows, groups = torch.arange(100)[:, None], torch.arange(4)[None, :]
    x[rows, groups * 32 + (rows % 5 * 7 + groups * 3) % 32] = 60.0 * torch.where(rows % 2 == 0, 1.0, -1.0)
    assert quantized_rows(x)[2].ne(0).all()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = Int8Linear()(x, pack_grid(grid), None)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(out.double(), reference(x, grid), atol=1e-3, rtol=1e-5)
    exact = x.double() @ weight.double().T
    assert (out.double() - exact).norm() < 0.01 * exact.norm()


def test_each_row_is_the_same_whatever_the_row_count() -> None:
    """A prompt computed whole and in pieces gives bit-identical rows (greedy text after a prefix-cache hit)."""
    _, grid = _grid(100, 704)
    torch.manual_seed(3)
    x = torch.randn(150, 704)
    kernel, packed = Int8Linear(), pack_grid(grid)
    whole = kernel(x, packed, None)
    for start, stop in ((0, 1), (7, 20), (90, 150), (149, 150)):
        assert torch.equal(kernel(x[start:stop], packed, None), whole[start:stop])


def test_zero_rows_and_strided_input() -> None:
    _, grid = _grid(16, 32)
    kernel, packed = Int8Linear(), pack_grid(grid)
    x = torch.randn(32, 3).T  # [3, 32], not contiguous
    torch.testing.assert_close(kernel(x, packed, None).double(), reference(x.contiguous(), grid), atol=1e-4, rtol=0)
    assert kernel(torch.empty(0, 32), packed, None).shape == (0, 16)
    assert torch.equal(kernel(torch.zeros(2, 32), packed, None), torch.zeros(2, 16))


def test_refuses_what_it_cannot_do() -> None:
    eight_bit = find_grid(grid_weight(16, 64, GGMLQuantizationType.Q8_0))  # 8-bit: test_cpu_int8_linear_8bit.py
    sixteen = WeightGrid(eight_bit.codes.to(torch.uint8) & 15, eight_bit.scales[:, :1].contiguous(),
                         eight_bit.offsets[:, :1].contiguous(), 4, 64)
    assert supports(eight_bit) and not supports(sixteen) and not supports(None)
    with pytest.raises(ValueError, match="4-bit grids of 32"):
        pack_grid(sixteen)
    kernel, packed = Int8Linear(), pack_grid(_grid(16, 32)[1])
    with pytest.raises(ValueError, match="no C int8 linear"):
        kernel(torch.randn(2, 32, dtype=torch.bfloat16), packed, None)
    with pytest.raises(ValueError, match="no C int8 linear"):
        kernel(torch.randn(2, 64), packed, None)
    with pytest.raises(ValueError, match="does not fit"):
        kernel(torch.randn(2, 32), packed, torch.randn(15))
