"""`--dtype auto`: half checkpoints keep their dtype, fp32 ones run in bfloat16 where the device is fast at it."""

from __future__ import annotations

import pytest
import torch

from services.gpu_worker import dtype_policy
from services.gpu_worker.dtype_policy import auto_dtype, cpu_has_amx, cpu_has_fast_bf16, kv_cache_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(("flags", "fast", "amx"), [
    ("fpu sse avx2 avx512f avx512_bf16 amx_tile", True, False),
    ("fpu sse avx2 amx_bf16 amx_tile", True, True),
    ("fpu sse avx2 avx512f avx512_vnni", False, False),
])
def test_cpu_flags(tmp_path, flags: str, fast: bool, amx: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n")
    assert cpu_has_fast_bf16(str(cpuinfo)) is fast
    assert cpu_has_amx(str(cpuinfo)) is amx


def test_missing_cpuinfo_means_no_bf16(tmp_path) -> None:
    assert cpu_has_fast_bf16(str(tmp_path / "absent")) is False
    assert cpu_has_amx(str(tmp_path / "absent")) is False


@pytest.mark.parametrize("fast", [True, False])
def test_auto_rules_on_cpu(monkeypatch, fast: bool) -> None:
    monkeypatch.setattr(dtype_policy, "cpu_has_fast_bf16", lambda: fast)
    half = torch.bfloat16 if fast else torch.float32
    assert auto_dtype(torch.float32, CPU) == half
    assert auto_dtype(torch.float16, CPU) == half  # fp16 matmuls are slow on CPUs
    assert auto_dtype(torch.bfloat16, CPU) == torch.bfloat16


def test_kv_cache_dtype() -> None:
    """auto: fp16 for an fp32 model on CPU, else the model's; an explicit narrower cache only on CPU."""
    cuda = torch.device("cuda")
    assert kv_cache_dtype("auto", torch.float32, CPU) == torch.float16
    assert kv_cache_dtype("auto", torch.bfloat16, CPU) == torch.bfloat16
    assert kv_cache_dtype("auto", torch.float32, cuda) == torch.float32
    assert kv_cache_dtype("float32", torch.float32, CPU) == torch.float32
    assert kv_cache_dtype("bfloat16", torch.bfloat16, cuda) == torch.bfloat16
    with pytest.raises(ValueError, match="only supported on CPU"):
        kv_cache_dtype("float16", torch.bfloat16, cuda)
    with pytest.raises(ValueError, match="unsupported dtype"):
        kv_cache_dtype("fp8", torch.float32, CPU)
