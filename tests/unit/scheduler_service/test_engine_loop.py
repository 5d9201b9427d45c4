"""The scheduler's asyncio loop against a fake worker: streams, aborts, idling, worker loss, state events."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pagedserve.services.grpc_errors import WorkerUnavailable
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import SAMPLED_TOKEN, FakeWorkerClient
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.engine_harness import outputs_of, running_engine


class RecordingState(NullStateWriter):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def request_arrived(self, req_id, num_prompt_tokens, arrival_time_s):
        self.events.append(("arrived", req_id, num_prompt_tokens))

    def request_first_token(self, req_id, num_cached_tokens):
        self.events.append(("first_token", req_id, num_cached_tokens))

    def request_finished(self, req_id, finish_reason, num_output_tokens, num_cached_tokens):
        self.events.append(("finished", req_id, finish_reason))


def request(req_id: str, max_tokens: int = 3, num_prompt_tokens: int = 6) -> GenerateRequest:
    return GenerateRequest(req_id, list(range(10, 10 + num_prompt_tokens)),
                           SamplingParams(max_tokens=max_tokens, temperature=0.0))


@pytest.fixture(params=[False, True], ids=["serial", "async"])
def async_scheduling(request) -> bool:
    return request.param


@contextlib.asynccontextmanager
async def running_loop(worker: FakeWorkerClient, async_scheduling: bool, **options):
    state = RecordingState()
    async with running_engine(worker, state, async_scheduling=async_scheduling, **options) as loop:
        yield loop, state



@pytest.mark.asyncio
async def test_concurrent_requests_stream_until_finished_and_free_their_blocks(async_scheduling):
    async with running_loop(FakeWorkerClient(), async_scheduling) as (loop, state):
        queues = [loop.add_request(request(f"r{i}", max_tokens=2 + i)) for i in range(3)]
        results = [await outputs_of(q) for q in queues]
    for i, outputs in enumerate(results):
        assert [t for o in outputs for t in o.new_token_ids] == [SAMPLED_TOKEN] * (2 + i)
        assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].num_output_tokens == 2 + i
    loop.scheduler.kv.check_integrity()
    assert loop.scheduler.kv.usage == 0.0 and loop.num_live_requests == 0
    assert ("first_token", "r0", 0) in state.events and ("finished", "r2", "length") in state.events


@pytest.mark.asyncio
async def test_abort_frees_blocks_at_once_and_the_worker_drops_the_mirror(async_scheduling):
    worker = FakeWorkerClient(step_delay_s=0.01)
    async with running_loop(worker, async_scheduling) as (loop, state):
        queue = loop.add_request(request("long", max_tokens=100))
        first = await asyncio.wait_for(queue.get(), 5)
        assert first.new_token_ids == [SAMPLED_TOKEN] and loop.scheduler.kv.usage > 0
        loop.abort_request("long")
        assert loop.scheduler.kv.usage == 0.0 and not loop.scheduler.has_unfinished_requests()
        loop.scheduler.kv.check_integrity()
        await wait_for_async(lambda: "long" not in worker.mirrors, what="the worker dropped the aborted request")
    assert any("long" in step.finished_req_ids for step in worker.steps)
    assert state.events[-1] == ("finished", "long", "abort")


@pytest.mark.asyncio
async def test_idle_loop_sleeps_and_wakes_on_a_new_request(async_scheduling):
    async with running_loop(FakeWorkerClient(), async_scheduling) as (loop, _):
        await outputs_of(loop.add_request(request("a")))
        num_steps = loop.num_steps
        await asyncio.sleep(0.1)
        assert loop.num_steps == num_steps  # no busy stepping while idle
        await outputs_of(loop.add_request(request("b")))
        assert loop.num_steps > num_steps


@pytest.mark.asyncio
async def test_rejected_request_leaves_no_trace(async_scheduling):
    async with running_loop(FakeWorkerClient(), async_scheduling) as (loop, state):
        with pytest.raises(RequestRejected):
            loop.add_request(request("huge", num_prompt_tokens=300))
        assert loop.num_live_requests == 0 and state.events == []


@pytest.mark.asyncio
async def test_lost_worker_fails_live_requests_then_serves_again(async_scheduling):
    worker = FakeWorkerClient()
    async with running_loop(worker, async_scheduling) as (loop, _):
        worker.fail_next_step = True
        queue = loop.add_request(request("doomed"))
        error = await asyncio.wait_for(queue.get(), 5)
        assert isinstance(error, WorkerUnavailable) and "UNAVAILABLE" in str(error)
        await wait_for_async(lambda: loop.ready, what="the loop ready again")
        assert worker.num_describes == 1 and loop.scheduler.kv.usage == 0.0
        outputs = await outputs_of(loop.add_request(request("after")))
    assert outputs[-1].finish_reason is FinishReason.LENGTH


class CallTaskWorker(FakeWorkerClient):
    """Records when each step is submitted (the real client queues it on the stream then)."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def submit(self, step, step_id, traceparents, step_traceparent=""):
        self.events.append(f"call {step_id} sent")
        return super().submit(step, step_id, traceparents, step_traceparent)


@pytest.mark.asyncio
async def test_the_next_step_is_sent_before_the_streams_wake_to_the_last_one(async_scheduling):
    """Streams woken by step N's outputs must not hold back step N + 1's call (each writes to the gateway)."""
    events: list[str] = []
    async with running_loop(CallTaskWorker(events), async_scheduling) as (loop, _):
        queues = [loop.add_request(request(f"r{i}", max_tokens=3)) for i in range(4)]

        async def consume(queue):  # like the Generate handler: awake as soon as its queue has an item
            while not (out := await queue.get()).finished:
                events.append(f"output {out.num_output_tokens}")
            events.append(f"output {out.num_output_tokens}")

        await asyncio.wait_for(asyncio.gather(*(consume(q) for q in queues)), 5)
    first_outputs = events.index("output 1")
    assert "call 2 sent" in events[:first_outputs], events
    assert events.count("output 3") == 4  # and every output still arrives, the last ones once the loop idles


class TimedWorker(FakeWorkerClient):
    """A step with tokens reports 1000 ns of forward pass (100 of sampling); every step, 50 ns of waiting for it."""

    async def step(self, step, step_id, traceparents):
        output = await super().step(step, step_id, traceparents)
        output.forward_time_ns, output.sample_time_ns = (0, 0) if step.is_empty else (1000, 100)
        output.idle_time_ns = 50
        return output


@pytest.mark.asyncio
async def test_worker_times_are_summed_and_its_wait_only_between_back_to_back_steps(async_scheduling):
    """The first step after the loop waited for work reports the worker's whole wait: no round trip of a step."""
    async with running_loop(TimedWorker(), async_scheduling) as (loop, _):
        for name in ("a", "b"):  # each after an idle loop: a prompt step, two decodes, then its mirror's drop
            await outputs_of(loop.add_request(request(name, max_tokens=3)))
            await asyncio.sleep(0.05)
        stats = loop.scheduler.snapshot_stats()
    assert loop.num_steps == 8 and [len(s.num_scheduled_tokens) for s in loop.worker.steps] == [1, 1, 1, 0] * 2
    assert (stats.worker_step_ns_total, stats.worker_sample_ns_total, stats.worker_idle_ns_total) == (6000, 600, 300)


@pytest.mark.asyncio
async def test_async_scheduling_keeps_a_step_queued_behind_the_running_one(async_scheduling):
    """Async: the next step is sent while one runs, and a request still streams exactly its tokens (the step sent
    after its last one computes a token that is dropped)."""
    worker = FakeWorkerClient(step_delay_s=0.005)
    async with running_loop(worker, async_scheduling) as (loop, _):
        outputs = await outputs_of(loop.add_request(request("a", max_tokens=5)))
        await wait_for_async(lambda: not loop.scheduler.finished_req_ids and not worker.mirrors,
                             what="the finished request dropped by the worker")
    assert worker.max_pending == (2 if async_scheduling else 1)
    assert [t for o in outputs for t in o.new_token_ids] == [SAMPLED_TOKEN] * 5
    assert outputs[-1].finish_reason is FinishReason.LENGTH and worker.mirrors == {}
    num_token_steps = sum(1 for step in worker.steps if step.num_scheduled_tokens)
    assert num_token_steps == 5  # prompt + 4 decodes: a request at its length limit is not scheduled again
    loop.scheduler.kv.check_integrity()
