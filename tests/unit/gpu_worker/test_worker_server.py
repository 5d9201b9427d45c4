"""The worker's gRPC servicer around a stand-in Worker: the Steps stream keeps the next step queued, answers in
order and reports how long the model thread waited for each step; the scheduler's client end of it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import grpc
import pytest

from pagedserve.services.gpu_worker.server import WorkerServicer, build_server
from pagedserve.services.ports import free_port
from pagedserve.services.proto_convert.worker_contract import step_input_to_pb, step_output_from_pb
from pagedserve.services.scheduler.worker_client import WorkerClient
from pagedserve.shared.step_protocol import StepInput, StepOutput
from tests.unit.gpu_worker.launched_step import DoneStep

STEP_S = 0.05


class StandInWorker:
    """Each step takes STEP_S; a step listing `boom` as finished raises (a bug on the worker's side)."""

    def __init__(self) -> None:
        self.executed: list[int] = []  # number of finished ids of each step, as a step tag
        self.lock = threading.Lock()

    def launch_step(self, step: StepInput) -> DoneStep:
        return DoneStep(self.execute_step(step))

    def execute_step(self, step: StepInput) -> StepOutput:
        if "boom" in step.finished_req_ids:
            raise RuntimeError("boom")
        time.sleep(STEP_S)
        with self.lock:
            self.executed.append(len(step.finished_req_ids))
        return StepOutput(forward_time_ns=int(STEP_S * 1e9), sample_time_ns=1_000_000)


class Context:
    """What the servicer reads of a unary call's context."""

    def invocation_metadata(self):
        return ()

    def abort(self, code, details):
        raise AssertionError(f"the step failed: {code} {details}")


def tagged(tag: int) -> StepInput:
    return StepInput(finished_req_ids=[f"x{i}" for i in range(tag)])


def test_each_step_reports_the_model_threads_wait_since_its_previous_step():
    servicer = WorkerServicer()
    servicer.worker = StandInWorker()
    first = step_output_from_pb(servicer.Step(step_input_to_pb(StepInput()), Context()))
    time.sleep(0.05)
    second = step_output_from_pb(servicer.Step(step_input_to_pb(StepInput()), Context()))
    assert first.idle_time_ns == 0  # nothing before it to wait after
    assert 0.05 <= second.idle_time_ns / 1e9 < 5
    assert (second.forward_time_ns, second.sample_time_ns) == (int(STEP_S * 1e9), 1_000_000)


@contextlib.asynccontextmanager
async def client_of(worker: StandInWorker):
    """A WorkerClient connected to a real worker server over `worker`; closed, and the server stopped, after."""
    servicer = WorkerServicer()
    servicer.worker = worker
    port = free_port()
    server, _ = build_server(servicer, "127.0.0.1", port)
    server.start()
    client = WorkerClient(f"127.0.0.1:{port}", step_timeout_s=30)
    try:
        yield client
    finally:
        await client.close()
        server.stop(None)


@pytest.mark.asyncio
async def test_steps_sent_back_to_back_run_in_order_without_the_worker_waiting():
    worker = StandInWorker()
    async with client_of(worker) as client:
        await asyncio.wait_for(client.submit(tagged(0), 1, {}), 30)  # the stream is open and warm
        replies = [client.submit(tagged(tag), 2 + tag, {}) for tag in (1, 2, 3)]  # sent before any answer
        outputs = await asyncio.wait_for(asyncio.gather(*replies), 30)
    assert worker.executed == [0, 1, 2, 3]
    # the second and third were queued while the one before ran: the model thread went straight on
    assert all(out.idle_time_ns < STEP_S * 1e9 / 2 for out in outputs[1:]), [out.idle_time_ns for out in outputs]


@pytest.mark.asyncio
async def test_a_failed_step_breaks_the_stream_until_it_is_reset():
    worker = StandInWorker()
    async with client_of(worker) as client:
        failing = client.submit(StepInput(finished_req_ids=["boom"]), 1, {})
        behind = client.submit(tagged(1), 2, {})
        for reply in (failing, behind):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await asyncio.wait_for(reply, 30)
            assert error.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE)
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(client.submit(tagged(2), 3, {}), 30)  # still broken
        await client.reset_stream()
        after = await asyncio.wait_for(client.submit(tagged(3), 4, {}), 30)
    assert after.forward_time_ns == int(STEP_S * 1e9) and worker.executed[-1] == 3
