"""The capture seam: CUDA graphs on a GPU, a fake that records and reruns the closure for tests on CPU.

A backend captures a zero-argument closure into a graph that `replay()` reruns on the same buffers. Every graph of
one runner shares one memory pool (`new_pool`), captured largest first so the smaller ones reuse its blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class CapturedGraph(Protocol):
    def replay(self) -> None: ...


class GraphBackend(Protocol):
    def new_pool(self) -> Any: ...

    def capture(self, body: Callable[[], None], pool: Any) -> CapturedGraph: ...

    def pool_bytes(self) -> int: ...


class CudaGraphBackend:
    """torch.cuda.CUDAGraph capture on a side stream (torch.cuda.graph's default), into the shared pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._reserved_before = torch.cuda.memory_reserved(device)

    def new_pool(self) -> Any:
        self._reserved_before = torch.cuda.memory_reserved(self.device)
        return torch.cuda.graph_pool_handle()

    def capture(self, body: Callable[[], None], pool: Any) -> CapturedGraph:
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            body()
        torch.cuda.synchronize(self.device)
        return graph

    def pool_bytes(self) -> int:
        """Device memory reserved since the pool was made: the graphs' pool and their outputs."""
        return torch.cuda.memory_reserved(self.device) - self._reserved_before


class FakeGraph:
    def __init__(self, body: Callable[[], None]) -> None:
        self.body = body
        self.num_replays = 0

    def replay(self) -> None:
        self.num_replays += 1
        self.body()


class FakeGraphBackend:
    """For CPU tests: capture runs the closure once (as a capture would, writing the static outputs) and records
    it; replay reruns it on whatever the static input buffers hold. `on_capture` wraps the capture's run (a test's
    sync detector or launch recorder)."""

    def __init__(self, on_capture: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.graphs: list[FakeGraph] = []
        self.on_capture = on_capture

    def new_pool(self) -> Any:
        return object()

    def capture(self, body: Callable[[], None], pool: Any) -> CapturedGraph:
        (self.on_capture or (lambda run: run()))(body)
        graph = FakeGraph(body)
        self.graphs.append(graph)
        return graph

    def pool_bytes(self) -> int:
        return 0
