"""What this CPU offers the kernels: its flags, read once from /proc/cpuinfo."""

from __future__ import annotations

from functools import cache
from pathlib import Path

_FAST_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU flags (empty where the cpuinfo file is missing)."""
    path = Path(cpuinfo)
    lines = path.read_text().splitlines() if path.is_file() else []
    return frozenset(next((line.split(":", 1)[-1] for line in lines if line.startswith("flags")), "").split())


def cpu_has_fast_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """bf16 dot products in hardware (AVX512-BF16 or AMX): bf16 matmuls beat fp32 ones there."""
    return any(flag in cpu_flags(cpuinfo) for flag in _FAST_BF16_FLAGS)


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    return "amx_bf16" in cpu_flags(cpuinfo)
