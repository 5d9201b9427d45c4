"""The Projector: one-row products through the compiled loop equal F.linear; other rows go to F.linear."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from services.gpu_worker.layers.linear import Projector


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_single_row_matches_linear(dtype: torch.dtype, atol: float, bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(96, 40, bias=bias, dtype=dtype).requires_grad_(False)
    proj = Projector(compile_single_row=True)
    proj.warm_up([layer])
    assert proj.single_row is not None  # compiled, no fall-back
    with torch.inference_mode():
        for rows in (1, 3):
            x = torch.randn(rows, 96, dtype=dtype)
            out = proj(x, layer)
            assert out.shape == (rows, 40) and out.dtype == dtype
            torch.testing.assert_close(out.float(), F.linear(x, layer.weight, layer.bias).float(), atol=atol, rtol=0)


def test_tied_embedding_head() -> None:
    embedding = nn.Embedding(50, 16).requires_grad_(False)
    proj = Projector(compile_single_row=True)
    with torch.inference_mode():
        hidden = torch.randn(1, 16)
        torch.testing.assert_close(proj(hidden, embedding), hidden @ embedding.weight.T, atol=1e-5, rtol=0)
