"""The worker's gRPC servicer around a stand-in Worker: how long its model thread waited for each step."""

from __future__ import annotations

import time

from services.gpu_worker.server import WorkerServicer
from services.proto_convert.worker_contract import step_input_to_pb, step_output_from_pb
from shared.step_protocol import StepInput, StepOutput


class StandInWorker:
    def execute_step(self, step: StepInput) -> StepOutput:
        time.sleep(0.01)
        return StepOutput(forward_time_ns=10_000_000, sample_time_ns=1_000_000)


class Context:
    """What the servicer reads of a gRPC call's context."""

    def invocation_metadata(self):
        return ()

    def abort(self, code, details):
        raise AssertionError(f"the step failed: {code} {details}")


def test_each_step_reports_the_model_threads_wait_since_its_previous_step():
    servicer = WorkerServicer()
    servicer.worker = StandInWorker()
    first = step_output_from_pb(servicer.Step(step_input_to_pb(StepInput()), Context()))
    time.sleep(0.05)
    second = step_output_from_pb(servicer.Step(step_input_to_pb(StepInput()), Context()))
    assert first.idle_time_ns == 0  # nothing before it to wait after
    assert 0.05 <= second.idle_time_ns / 1e9 < 5
    assert (second.forward_time_ns, second.sample_time_ns) == (10_000_000, 1_000_000)
