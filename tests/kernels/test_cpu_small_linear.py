"""The C few-row linear kernel (kernels/cpu/small_linear.c) against F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.small_linear import MAX_ROWS, SmallLinear, supports

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}  # bf16: one rounding of outputs of magnitude ~10


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("in_features", [64, 200])  # 200: a tail shorter than one 16-float vector
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_linear_for_every_row_count(dtype: torch.dtype, in_features: int, bias: bool) -> None:
    torch.manual_seed(in_features)
    weight = torch.randn(70, in_features, dtype=dtype)
    b = torch.randn(70, dtype=dtype) if bias else None
    kernel = SmallLinear()
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(rows, in_features, dtype=dtype)
        out = kernel(x, weight, b)
        assert out.shape == (rows, 70) and out.dtype == dtype
        torch.testing.assert_close(out.float(), F.linear(x, weight, b).float(), atol=TOLERANCE[dtype], rtol=1e-2)


def test_strided_input_is_made_contiguous() -> None:
    weight = torch.randn(16, 32)
    x = torch.randn(32, 3).T  # [3, 32], not contiguous
    torch.testing.assert_close(SmallLinear()(x, weight, None), F.linear(x, weight), atol=1e-4, rtol=0)


def test_refuses_what_it_cannot_do() -> None:
    weight = torch.randn(16, 32)
    assert supports(torch.randn(MAX_ROWS, 32), weight)
    assert not supports(torch.randn(MAX_ROWS + 1, 32), weight)
    assert not supports(torch.randn(2, 32, dtype=torch.float16), weight.half())
    assert not supports(torch.randn(2, 32, dtype=torch.bfloat16), weight)  # mixed dtypes
    assert not supports(torch.randn(2, 32), torch.randn(32, 16).T)  # transposed weight view
    with pytest.raises(ValueError, match="no C small-row kernel"):
        SmallLinear()(torch.randn(MAX_ROWS + 1, 32), weight, None)
