"""The C fused elementwise kernels (kernels/cpu/fused_ops.c) against the torch code they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.fused_ops import FusedOps, supports
from pagedserve.services.gpu_worker.layers.rotary import apply_rotary

# fp32: reduction order only; bf16: at most one rounding step of the outputs (values of magnitude up to ~4)
TOLERANCE = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=3e-2, rtol=1e-2)}
DTYPES = [torch.float32, torch.bfloat16]


def _torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("rows", [1, 5, 40])  # 40: split over threads
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_and_without_residual(dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(rows)
    x, residual = torch.randn(rows, 96, dtype=dtype), torch.randn(rows, 96, dtype=dtype)
    weight = torch.rand(96, dtype=dtype) + 0.5
    ops = FusedOps()
    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), _torch_rms_norm(x, weight, 1e-5), **TOLERANCE[dtype])
    summed = residual + x
    out = ops.rms_norm(x, weight, 1e-5, residual=residual)
    assert torch.equal(residual, summed)  # the residual now holds the (rounded) sum
    torch.testing.assert_close(out, _torch_rms_norm(summed, weight, 1e-5), **TOLERANCE[dtype])


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 48, dtype=dtype) * 4  # both signs, large magnitudes
    gate, up = gate_up.split(48, dim=-1)
    torch.testing.assert_close(FusedOps().silu_mul(gate_up), F.silu(gate) * up, **TOLERANCE[dtype])


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_views_of_a_fused_projection(dtype: torch.dtype, rows: int) -> None:
    torch.manual_seed(rows)
    heads, kv_heads, dim = 6, 2, 64
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, dtype=dtype)
    q = qkv[:, : heads * dim].view(rows, heads, dim)
    k = qkv[:, heads * dim: (heads + kv_heads) * dim].view(rows, kv_heads, dim)
    angles = torch.rand(rows, 1, dim // 2) * 6
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    want_q, want_k = apply_rotary(q.clone(), k.clone(), cos, sin)
    v_before = qkv[:, (heads + kv_heads) * dim:].clone()
    ops = FusedOps()
    ops.rotary_(q, cos, sin)
    ops.rotary_(k, cos, sin)
    torch.testing.assert_close(q, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k, want_k, **TOLERANCE[dtype])
    assert torch.equal(qkv[:, (heads + kv_heads) * dim:], v_before)  # v untouched


def test_supports_only_multiples_of_16_and_cpu_float_types() -> None:
    assert supports(torch.zeros(2, 64), 64)
    assert not supports(torch.zeros(2, 40), 40)
    assert not supports(torch.zeros(2, 64, dtype=torch.float16), 64)
