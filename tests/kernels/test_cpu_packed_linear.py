"""The C fp32 GEMM on packed weights (kernels/cpu/packed_linear.c) against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu.packed_linear import PANEL, PackedLinear, pack_weight, supports


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return (out if bias is None else out + bias.double()).float()


def test_packing_layout() -> None:
    weight = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)
    packed = pack_weight(weight)
    assert packed.shape == (2, 3, PANEL) and packed.is_contiguous()
    assert torch.equal(packed[1, 2, 3], weight[PANEL + 3, 2])
    assert torch.equal(packed[1, :, 4:], torch.zeros(3, PANEL - 4))  # columns past the last are zero


# rows: tiles of 6 with every tail, and more than one 96-row block; in: one and several 256-wide k-blocks;
# out: whole panels and a last partial one
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 96, 97, 200])
@pytest.mark.parametrize(("in_features", "out_features"), [(64, 40), (576, 192), (600, 33)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_reference(rows: int, in_features: int, out_features: int, bias: bool) -> None:
    torch.manual_seed(rows * 7 + in_features)
    weight = torch.randn(out_features, in_features)
    b = torch.randn(out_features) if bias else None
    x = torch.randn(rows, in_features)
    out = PackedLinear()(x, pack_weight(weight), out_features, b)
    assert out.shape == (rows, out_features) and out.dtype == torch.float32
    torch.testing.assert_close(out, _reference(x, weight, b), atol=2e-4 * in_features**0.5, rtol=1e-5)


def test_each_row_is_the_same_whatever_the_row_count() -> None:
    """A prompt computed whole and in pieces must give bit-identical rows (greedy text after a prefix hit)."""
    torch.manual_seed(3)
    weight, x = torch.randn(100, 700), torch.randn(150, 700)
    kernel, packed = PackedLinear(), pack_weight(weight)
    whole = kernel(x, packed, 100, None)
    for start, stop in ((0, 1), (7, 20), (90, 150), (149, 150)):
        assert torch.equal(kernel(x[start:stop], packed, 100, None), whole[start:stop])


def test_strided_input_and_no_rows() -> None:
    weight = torch.randn(16, 32)
    kernel, packed = PackedLinear(), pack_weight(weight)
    x = torch.randn(32, 3).T  # [3, 32], not contiguous
    torch.testing.assert_close(kernel(x, packed, 16, None), _reference(x, weight, None), atol=1e-4, rtol=0)
    assert kernel(torch.empty(0, 32), packed, 16, None).shape == (0, 16)


def test_refuses_what_it_cannot_do() -> None:
    assert supports(torch.randn(4, 8)) and not supports(torch.randn(4, 8, dtype=torch.bfloat16))
    kernel, packed = PackedLinear(), pack_weight(torch.randn(16, 32))
    with pytest.raises(ValueError, match="no C packed linear"):
        kernel(torch.randn(2, 32, dtype=torch.bfloat16), packed, 16, None)
    with pytest.raises(ValueError, match="no C packed linear"):
        kernel(torch.randn(2, 31), packed, 16, None)
    with pytest.raises(ValueError, match="does not fit"):
        kernel(torch.randn(2, 32), packed, 16, torch.randn(15))
