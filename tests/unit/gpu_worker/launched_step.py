"""A stand-in worker's launched step, as the worker server takes it from `launch_step`: already done."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.shared.step_protocol import StepOutput


@dataclass
class DoneStep:
    output: StepOutput
    ready: bool = True  # result() needs no wait for a device

    def result(self) -> StepOutput:
        return self.output
