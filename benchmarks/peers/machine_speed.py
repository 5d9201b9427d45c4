"""How fast this machine multiplies right now, measured before and after a suite.

On a cloud VM the same machine kind can run 1.5-2x apart from one hour to the next: its vCPUs may be two
hyperthreads of one core, or share their cores with other tenants. Ratios measured in one run stay comparable;
absolute figures from two runs compare only with this beside them. A ratio all-threads / one-thread near 1
instead of the thread count says the threads share one core's vector units.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

_SHAPE = (512, 576, 1536)  # rows x in x out: one MLP projection of the default model over a 512-token step
_REPEATS = 40


@dataclass(frozen=True)
class MachineSpeed:
    measured_at: str
    threads: int
    gflops_one_thread: float  # median of _REPEATS fp32 GEMMs
    gflops_all_threads: float

    @property
    def scaling(self) -> float:
        return self.gflops_all_threads / self.gflops_one_thread

    def line(self) -> str:
        return (f"fp32 GEMM {self.gflops_one_thread:.0f} GFLOP/s on 1 thread, {self.gflops_all_threads:.0f} on "
                f"{self.threads} ({self.scaling:.2f}x), at {self.measured_at}")

    def to_dict(self) -> dict:
        return {**asdict(self), "scaling": round(self.scaling, 3)}


def measure_speed(threads: int | None = None) -> MachineSpeed:
    """torch's fp32 GEMM at one thread and at `threads` (default: every CPU); torch's thread count is restored."""
    threads = threads or os.cpu_count() or 1
    rows, inner, out = _SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=generator)
    b = torch.randn(inner, out, generator=generator)
    previous = torch.get_num_threads()
    try:
        one, every = _gflops(a, b, 1), _gflops(a, b, threads)
    finally:
        torch.set_num_threads(previous)
    return MachineSpeed(time.strftime("%Y-%m-%d %H:%M:%S %Z"), threads, round(one, 1), round(every, 1))


def _gflops(a: torch.Tensor, b: torch.Tensor, threads: int) -> float:
    torch.set_num_threads(threads)
    torch.mm(a, b)  # warm-up: thread pool and caches
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / statistics.median(times) / 1e9


def save_speeds(path: Path, speeds: dict[str, MachineSpeed]) -> None:
    """The probes by when they ran ("before", "after"), as JSON beside the results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({when: speed.to_dict() for when, speed in speeds.items()}, indent=2) + "\n")
