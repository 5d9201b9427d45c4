"""The C fp32 GEMM on packed weights (kernels/cpu/packed_linear.c) against a float64 reference, and its coded
weights (4- and 8-bit grids) against its own fp32 panels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from pagedserve.kernels.cpu.packed_linear import PANEL, PackedLinear, pack_weight, supports
from pagedserve.kernels.cpu.weight_grid import find_grid


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return (out if bias is None else out + bias.double()).float()


def test_packing_layout() -> None:
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = pack_weight(weight)
    assert packed.bits == 32 and (packed.out_features, packed.in_features) == (20, 3)
    assert packed.values.shape == (2, 3, PANEL) and packed.values.is_contiguous()
    assert torch.equal(packed.values[1, 2, 3], weight[PANEL + 3, 2])
    assert torch.equal(packed.values[1, :, 4:], torch.zeros(3, PANEL - 4))  # columns past the last are zero


# rows: 1-4 through the direct path (one pass per group of panels), tiles of 6 with every tail, and more than one
# 96-row block; in: one and several 256-wide k-blocks; out: whole panels and a last partial one
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 96, 97, 200])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 192), (600, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(rows: int, in_features: int, out_features: int, bias: bool) -> None:
    torch.manual_seed(rows * 7 + in_features)
    weight = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features)
    out = PackedLinear()(x, pack_weight(weight), b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    torch.testing.assert_close(out, _reference(x, weight, b), atol=2e-4 * in_features**0.5, rtol=1e-5)


def test_each_row_is_the_same_whatever_the_row_count() -> None:
    """A prompt computed whole and in pieces must give bit-identical rows (greedy text after a prefix hit)."""
    torch.manual_seed(3)
    weight, x = torch.randn(100, 700), torch.randn(150, 700)
    kernel, packed = PackedLinear(), pack_weight(weight)
    whole = kernel(x, packed, None)
    for start, stop in ((0, 1), (7, 20), (90, 150), (149, 150)):
        assert torch.equal(kernel(x[start:stop], packed, None), whole[start:stop])


def test_strided_input_and_no_rows() -> None:
    weight = torch.randn(16, 32)
    kernel, packed = PackedLinear(), pack_weight(weight)
    x = torch.randn(32, 3).T  # [3, 32], not contiguous
    torch.testing.assert_close(kernel(x, packed, None), _reference(x, weight, None), atol=1e-4, rtol=0)
    assert kernel(torch.empty(0, 32), packed, None).shape == (0, 16)


def test_refuses_what_it_cannot_do() -> None:
    assert supports(torch.randn(4, 8)) and not supports(torch.randn(4, 8, dtype=torch.bfloat16))
    kernel, packed = PackedLinear(), pack_weight(torch.randn(16, 32))
    with pytest.raises(ValueError, match="no C packed linear"):
        kernel(torch.randn(2, 32, dtype=torch.bfloat16), packed, None)
    with pytest.raises(ValueError, match="no C packed linear"):
        kernel(torch.randn(2, 31), packed, None)
    with pytest.raises(ValueError, match="does not fit"):
        kernel(torch.randn(2, 32), packed, torch.randn(15))


def grid_weight(out_features: int, in_features: int, qtype: GGMLQuantizationType) -> torch.Tensor:
    """A weight as a 4- or 8-bit checkpoint dequantizes to fp32 (GGUF Q4_1 / Q8_0 through the gguf package)."""
    rng = np.random.default_rng(out_features * in_features)
    values = rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05
    return torch.from_numpy(dequantize(quantize(values, qtype), qtype).copy())


@pytest.mark.parametrize(("qtype", "bits"), [(GGMLQuantizationType.Q4_1, 4), (GGMLQuantizationType.Q8_0, 8)])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 192), (608, 33)])
def test_coded_weights_give_the_fp32_panels_numbers(qtype, bits: int, in_features: int, out_features: int) -> None:
    """Expanded in registers (1-4 rows) or through the tiles (more): the same bits as the fp32 panels."""
    weight = grid_weight(out_features, in_features, qtype)
    coded, panels = pack_weight(weight), pack_weight(weight, find_codes=False)
    assert coded.bits == bits and panels.bits == 32
    assert coded.nbytes() < panels.nbytes() / (3 if bits == 8 else 5)
    torch.manual_seed(in_features)
    kernel, bias = PackedLinear(), torch.randn(out_features)
    for rows in (1, 2, 3, 4, 5, 7, 97, 200):
        x = torch.randn(rows, in_features)
        out = kernel(x, coded, bias)
        assert torch.equal(out, kernel(x, panels, bias)), rows
        torch.testing.assert_close(out, _reference(x, weight, bias), atol=2e-4 * in_features**0.5, rtol=1e-5)


def test_coded_layout() -> None:
    """4-bit codes: byte j of a panel row holds column j in its low nibble and column j + 8 in its high one."""
    weight = grid_weight(30, 64, GGMLQuantizationType.Q4_1)
    packed, grid = pack_weight(weight), find_grid(weight)
    assert packed.values.shape == (2, 64, PANEL // 2) and packed.values.dtype == torch.uint8
    assert packed.scales.shape == packed.offsets.shape == (2, 2, PANEL)
    k, column = 40, PANEL + 9
    assert packed.values[1, k, 1] == grid.codes[PANEL + 1, k] | (grid.codes[column, k] << 4)
    assert packed.scales[1, k // 32, 9] == grid.scales[column, k // 32]
    assert torch.equal(packed.values[1, :, 6:] >> 4, torch.zeros(64, 2, dtype=torch.uint8))  # columns 30, 31: padding


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 40), (768, 33)])
def test_gguf_block_grids_give_the_fp32_panels_numbers(qtype: str, in_features: int, out_features: int) -> None:
    """A GGUF tensor's blocks as a grid (Q6_K: 8-bit codes in groups of 16) through the coded panels: the numbers
    of its dequantized fp32 weight (gguf.quants) in fp32 panels, bit for bit."""
    from pagedserve.services.gpu_worker.gguf.blocks import grid_from_blocks
    from tests.unit.gpu_worker.tiny_gguf import quantize as gguf_quantize

    kind = GGMLQuantizationType[qtype]
    rng = np.random.default_rng(in_features + out_features)
    blocks = gguf_quantize(rng.standard_normal((out_features, in_features)).astype(np.float32) * 0.05, kind)
    weight = torch.from_numpy(dequantize(blocks, kind).copy())
    grid = grid_from_blocks(blocks, kind, out_features, in_features)
    coded, panels = pack_weight(None, grid=grid), pack_weight(weight, find_codes=False)
    assert (coded.bits, coded.group) == ((8, 16) if qtype == "Q6_K" else (8, 32) if qtype == "Q5_K" else (4, 32))
    torch.manual_seed(in_features)
    kernel, bias = PackedLinear(), torch.randn(out_features)
    for rows in (1, 2, 3, 4, 5, 7, 97):
        x = torch.randn(rows, in_features)
        assert torch.equal(kernel(x, coded, bias), kernel(x, panels, bias)), rows
