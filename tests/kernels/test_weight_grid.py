"""Finding exact 4- and 8-bit grids in fp32 weights (kernels/cpu/weight_grid.py)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from pagedserve.kernels.cpu.weight_grid import find_grid
from tests.kernels.test_cpu_packed_linear import grid_weight


def _rebuilt(grid) -> torch.Tensor:
    out_features, in_features = grid.codes.shape
    codes = grid.codes.float().view(out_features, -1, 32)
    return (codes * grid.scales.unsqueeze(-1) + grid.offsets.unsqueeze(-1)).view(out_features, in_features)


@pytest.mark.parametrize(("qtype", "bits", "dtype"), [(GGMLQuantizationType.Q4_1, 4, torch.uint8),
                                                      (GGMLQuantizationType.Q8_0, 8, torch.int8)])
def test_finds_the_grid_of_a_dequantized_checkpoint(qtype, bits: int, dtype: torch.dtype) -> None:
    weight = grid_weight(48, 96, qtype)
    grid = find_grid(weight)
    assert grid is not None and grid.bits == bits and grid.codes.dtype == dtype
    assert grid.codes.shape == weight.shape and grid.scales.shape == grid.offsets.shape == (48, 3)
    assert torch.equal(grid.scales, grid.scales.half().float())  # 11 significant bits: q * scale is exact
    assert torch.equal(_rebuilt(grid), weight)
    if bits == 4:
        assert int(grid.codes.max()) <= 15
    else:
        assert not grid.offsets.any()


def test_one_value_off_the_grid_means_no_grid() -> None:
    weight = grid_weight(48, 96, GGMLQuantizationType.Q4_1)
    weight[7, 50] = torch.nextafter(weight[7, 50], torch.tensor(1.0))
    assert find_grid(weight) is None


def test_no_grid_in_ordinary_weights() -> None:
    assert find_grid(torch.randn(16, 64)) is None
    assert find_grid(grid_weight(16, 64, GGMLQuantizationType.Q4_1)[:, :48]) is None  # not whole groups of 32
    assert find_grid(grid_weight(16, 64, GGMLQuantizationType.Q8_0).bfloat16()) is None  # fp32 only
    zeros = find_grid(torch.zeros(4, 32))  # a constant group: scale 0
    assert zeros is not None and zeros.bits == 4 and not zeros.codes.any() and not zeros.scales.any()
