"""Count what a piece of the forward launches: Triton kernels by their launches, torch ops by their aten calls.

On CPU no CUDA profiler runs, so the count is of calls: every Triton launch (interpreted or compiled) is one, and
every aten op that reaches the dispatcher outside a launch is one, except views (they launch nothing) and bare
allocations (empty*: no kernel). A CUDA op may launch more than one kernel (cuBLAS may add a split-K reduction);
the profiler on the device is the final word, this count the CPU-side guard.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


@dataclass
class Launches:
    names: list[str] = field(default_factory=list)  # "triton:<kernel>" or "aten:<op>", in launch order
    depth: int = 0  # > 0 inside a Triton launch, whose own torch calls (argument copies) are not kernels


class _AtenCounter(TorchDispatchMode):
    def __init__(self, launches: Launches) -> None:
        super().__init__()
        self.launches = launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket.__name__
        if self.launches.depth == 0 and not func.is_view and packet not in _ALLOCATIONS:
            self.launches.names.append(f"aten:{packet}")
        return func(*args, **(kwargs or {}))


@contextmanager
def count_launches() -> Iterator[Launches]:
    """Record the launches inside the block (Triton's run methods are wrapped for its duration)."""
    launches = Launches()
    originals = {cls: cls.run for cls in (InterpretedFunction, JITFunction)}

    def wrap(run):
        def counted(self, *args, **kwargs):
            launches.names.append(f"triton:{self.__name__ if hasattr(self, '__name__') else self.fn.__name__}")
            launches.depth += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                launches.depth -= 1
        return counted

    for cls, run in originals.items():
        cls.run = wrap(run)
    try:
        with _AtenCounter(launches):
            yield launches
    finally:
        for cls, run in originals.items():
            cls.run = run
