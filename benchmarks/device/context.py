"""What a section of the device script is given: the run's shared state and its own name and deadline."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pagedserve.benchmarks.device.results import Results

SHAPES_DIR = Path(__file__).resolve().parent.parent / "shapes"


@dataclass
class RunState:
    dry_run: bool  # CPU, TRITON_INTERPRET=1, toy sizes
    device: torch.device
    results: Results
    capture_ok: bool = False  # the graph-capture probe passed: graph timing and the graph sections may run


@dataclass
class Section:
    state: RunState
    name: str
    deadline: float  # time.monotonic() by which the section stops starting new items

    @property
    def dry_run(self) -> bool:
        return self.state.dry_run

    @property
    def device(self) -> torch.device:
        return self.state.device

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self, item: str) -> bool:
        """True (and noted) when the section's box is spent before `item` starts."""
        if self.time_left() > 0:
            return False
        self.note(f"time box spent: {item} and what follows not run")
        return True

    def row(self, **row: Any) -> None:
        self.state.results.add_row(self.name, row)

    def note(self, text: str) -> None:
        self.state.results.note(self.name, text)
