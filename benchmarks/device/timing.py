"""Milliseconds per kernel call: replayed from one CUDA graph (no launch or host time in the figure), cycling
through several buffer sets so each call reads what the previous ones pushed out of L2 (cold L2)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

REPLAYS = 5  # the figure is the median of this many timed replays
MAX_SETS = 4  # the issue's ">= 4 buffer sets" (an 8k-token K/V fits an H200's L2)
SET_MEMORY_CAP = 16 * 1024**3  # bytes all sets of one item may take together


@dataclass(frozen=True)
class Timing:
    ms: float
    how: str  # "graph" (replayed CUDA graph), "events" (eager, CUDA events), "wall" (CPU wall clock)


def num_buffer_sets(set_bytes: int, l2_bytes: int) -> int:
    """MAX_SETS when they fit SET_MEMORY_CAP; else as many as fit, at least 1 (a set that large is far beyond any
    L2: its own size keeps each call cold)."""
    fit = max(1, SET_MEMORY_CAP // max(1, set_bytes))
    if fit < MAX_SETS:
        assert set_bytes > 4 * l2_bytes, "fewer than 4 sets only where one set alone is far beyond L2"
    return min(MAX_SETS, fit)


def time_calls(calls: list[Callable[[], object]], device: torch.device, use_graph: bool, reps: int) -> Timing:
    """Median ms per call of `reps` calls cycling through `calls` (one closure per buffer set), each warmed first
    (Triton compiles, cuBLAS/cuDNN plans)."""
    for call in calls:
        call()
    if device.type != "cuda":
        start = time.perf_counter()
        for i in range(reps):
            calls[i % len(calls)]()
        return Timing((time.perf_counter() - start) * 1e3 / reps, "wall")
    torch.cuda.synchronize()
    how = "events"
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(reps):
                    calls[i % len(calls)]()
            return Timing(_median_ms(graph.replay) / reps, "graph")
        except RuntimeError as exc:  # this call is not capturable: timed eagerly, and the row says why
            torch.cuda.synchronize()
            how = f"events (capture failed: {str(exc).splitlines()[0][:80]})"
    return Timing(_median_ms(lambda: [calls[i % len(calls)]() for i in range(reps)]) / reps, how)


def _median_ms(run: Callable[[], object]) -> float:
    run()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def l2_bytes(device: torch.device) -> int:
    """The device's L2 size (a CPU dry run uses 1 MiB, to exercise the same set arithmetic)."""
    if device.type != "cuda":
        return 1024**2
    return torch.cuda.get_device_properties(device).L2_cache_size
