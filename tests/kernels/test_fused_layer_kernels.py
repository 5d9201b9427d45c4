"""The CUDA platform's fused layer kernels (RMSNorm(+residual), rotary in place, SiLU-mul) against the portable
torch kernels of services/gpu_worker/layers run in fp32 on the same rounded inputs."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.fused_rms_norm import fused_rms_norm
from pagedserve.kernels.rotary_embedding import rotary_in_place
from pagedserve.kernels.silu_and_mul import fused_silu_and_mul
from pagedserve.services.gpu_worker.layers.activation import silu_and_mul
from pagedserve.services.gpu_worker.layers.norm import rms_norm
from pagedserve.services.gpu_worker.layers.rotary import apply_rotary
from tests.kernels.tolerances import TOLERANCES

DTYPES = [torch.float32, torch.bfloat16]
# Triton's interpreter converts fp32 to bf16 by truncation (1 + 2**-8 + 2**-10 becomes 1.0, not 1 + 2**-7): up to
# twice round-to-nearest's error, so bf16 bounds double under it; compiled on a GPU the plain bounds hold.
INTERPRETER_BF16_FACTOR = 2


def assert_close_to_ref(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """tolerances.assert_close_to_ref, widened for the interpreter's bf16 truncation (on CPU only)."""
    atol, rtol = TOLERANCES[dtype]
    factor = INTERPRETER_BF16_FACTOR if dtype == torch.bfloat16 and out.device.type == "cpu" else 1
    assert out.dtype == dtype
    torch.testing.assert_close(out.float().cpu(), ref, atol=atol * factor, rtol=rtol * factor)


def _randn(*shape: int, dtype: torch.dtype, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,cols", [(1, 64), (3, 96), (7, 576), (2, 2048)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(device, dtype, rows, cols, with_residual):
    x = _randn(rows, cols, dtype=dtype, device=device, seed=rows * cols)
    weight = _randn(cols, dtype=dtype, device=device, seed=1) * 0.5 + 1
    residual = _randn(rows, cols, dtype=dtype, device=device, seed=2) if with_residual else None
    expected_sum = None if residual is None else (residual + x)  # torch's add: fp32 sum rounded to the dtype
    ref_residual = None if residual is None else residual.float().clone()
    ref = rms_norm(x.float(), weight.float(), 1e-6, ref_residual)
    out = fused_rms_norm(x, weight, 1e-6, residual)
    assert_close_to_ref(out, ref.cpu(), dtype)
    if residual is not None:  # the sum rounded once to the dtype: torch's own add on a GPU, one ulp under truncation
        ulp = 0 if device.type == "cuda" or dtype == torch.float32 else 2**-7
        torch.testing.assert_close(residual, expected_sum, atol=0, rtol=ulp)


def test_rms_norm_strided_rows(device):
    """Rows of a wider tensor (a view with a row stride) normalise like their contiguous copy."""
    wide = _randn(5, 80, dtype=torch.float32, device=device, seed=3)
    weight = torch.ones(64, device=device)
    assert_close_to_ref(fused_rms_norm(wide[:, :64], weight, 1e-5), rms_norm(wide[:, :64].contiguous(), weight,
                                                                             1e-5).cpu(), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_dim", [(1, 8, 2, 8), (3, 4, 4, 16), (5, 9, 3, 64),
                                                              (2, 32, 8, 128)])
def test_rotary_in_place_on_qkv_views(device, dtype, tokens, q_heads, kv_heads, head_dim):
    """q and k as the views of one fused qkv row the model gives the kernel; v is left untouched."""
    qkv = _randn(tokens, (q_heads + 2 * kv_heads) * head_dim, dtype=dtype, device=device, seed=tokens + head_dim)
    q, k, v = qkv.split([q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    angles = _randn(tokens, head_dim // 2, dtype=torch.float32, device=device, seed=5) * 3
    cos, sin = angles.cos().to(dtype).unsqueeze(1), angles.sin().to(dtype).unsqueeze(1)
    ref_q, ref_k = apply_rotary(q.float(), k.float(), cos.float(), sin.float())
    v_before = v.clone()
    out_q, out_k = rotary_in_place(q, k, cos, sin)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    assert_close_to_ref(q, ref_q.cpu(), dtype)
    assert_close_to_ref(k, ref_k.cpu(), dtype)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 96), (4, 1536), (3, 2500)])
def test_silu_and_mul(device, dtype, rows, width):
    gate_up = _randn(rows, 2 * width, dtype=dtype, device=device, seed=rows + width) * 2
    assert_close_to_ref(fused_silu_and_mul(gate_up), silu_and_mul(gate_up.float()).cpu(), dtype)
