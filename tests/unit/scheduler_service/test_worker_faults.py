"""The engine loop and its WorkerMonitor when the worker restarts, vanishes, stops serving or fails one request."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from pagedserve.services.grpc_errors import RequestFailed, ServiceNotReady, WorkerUnavailable
from pagedserve.services.scheduler.readiness import NotReady, Readiness
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.services.scheduler.worker_monitor import WorkerMonitor, WorkerProbe, WorkerStatus
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import FailedRequest
from tests.support.fake_worker_client import SAMPLED_TOKEN, FakeWorkerClient
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.engine_harness import outputs_of, running_engine

PROMPT = list(range(10, 22))  # three full blocks of 4


def request(req_id: str, max_tokens: int = 3, prompt: list[int] = PROMPT) -> GenerateRequest:
    return GenerateRequest(req_id, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0.0))


@contextlib.asynccontextmanager
async def running(worker: FakeWorkerClient):
    async with running_engine(worker, readiness=Readiness()) as loop:
        yield loop, WorkerMonitor(worker, loop, interval_s=60, timeout_s=1)  # probed by hand



@pytest.mark.asyncio
async def test_a_restart_mid_stream_fails_it_and_the_new_pool_is_used_from_then_on():
    worker = FakeWorkerClient(step_delay_s=0.01)
    async with running(worker) as (loop, _):
        queue = loop.add_request(request("long", max_tokens=100))
        first = await asyncio.wait_for(queue.get(), 5)
        assert first.new_token_ids == [SAMPLED_TOKEN]
        worker.restart(num_kv_blocks=4)  # fewer blocks than the old pool: old ids would lie past it
        items = await outputs_of(queue)
        assert isinstance(items[-1], WorkerUnavailable) and "restarted" in str(items[-1])
        await wait_for_async(lambda: loop.ready, what="recovery")
        assert loop.scheduler.description == worker.description and loop.scheduler.kv.pool.num_blocks == 4
        outputs = await outputs_of(loop.add_request(request("after", prompt=[1, 2, 3])))
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    new_steps = [s for s in worker.steps if s.incarnation_id == worker.description.incarnation_id]
    assert new_steps and all(b < 4 for s in new_steps for r in s.new_requests for b in r.block_ids)
    assert all(s.finished_req_ids == [] for s in new_steps[:1])  # no mirror of the old incarnation to drop
    loop.scheduler.kv.check_integrity()


@pytest.mark.asyncio
async def test_a_restart_while_idle_is_found_by_the_monitor_and_no_stale_prefix_is_served():
    worker = FakeWorkerClient()
    async with running(worker) as (loop, monitor):
        await outputs_of(loop.add_request(request("before")))
        assert len(loop.scheduler.kv.prefix_index) == 3
        worker.restart()
        await monitor.probe_once()
        assert not loop.ready
        await wait_for_async(lambda: loop.ready, what="recovery")
        assert worker.num_describes == 1 and len(loop.scheduler.kv.prefix_index) == 0
        outputs = await outputs_of(loop.add_request(request("again")))
    assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].num_cached_tokens == 0
    again = next(r for s in worker.steps for r in s.new_requests if r.req_id == "again")
    assert again.num_computed_tokens == 0  # computed afresh, not read from the new worker's empty pool


@pytest.mark.asyncio
async def test_an_unreachable_idle_worker_makes_the_scheduler_unready_until_it_is_back():
    worker = FakeWorkerClient()
    async with running(worker) as (loop, monitor):
        worker.status, worker.back = WorkerStatus.UNREACHABLE, asyncio.Event()
        await monitor.probe_once()
        await wait_for_async(lambda: loop.recovering, what="recovery started")
        assert loop.readiness.has(NotReady.WORKER_LOST)
        with pytest.raises(ServiceNotReady, match="lost its worker"):
            loop.add_request(request("refused"))
        await monitor.probe_once()  # probes while recovering change nothing
        worker.status = WorkerStatus.SERVING
        worker.back.set()
        await wait_for_async(lambda: loop.ready, what="recovery")
        outputs = await outputs_of(loop.add_request(request("served")))
    assert outputs[-1].finish_reason is FinishReason.LENGTH


@pytest.mark.asyncio
async def test_an_unanswered_probe_is_ignored_when_a_step_finished_since_it_was_sent():
    worker = FakeWorkerClient()
    async with running(worker) as (loop, monitor):
        sent_s = time.monotonic()
        loop.last_step_end_s = sent_s + 1.0
        monitor.judge(WorkerProbe(WorkerStatus.UNREACHABLE, detail="DEADLINE_EXCEEDED"), sent_s)
        assert loop.ready
        monitor.judge(WorkerProbe(WorkerStatus.UNREACHABLE, detail="DEADLINE_EXCEEDED"), sent_s + 2.0)
        assert loop.readiness.has(NotReady.WORKER_LOST)


@pytest.mark.asyncio
async def test_a_step_in_flight_is_abandoned_when_the_worker_stops_answering_probes():
    worker = FakeWorkerClient(step_delay_s=0.01)
    async with running(worker) as (loop, monitor):
        queue = loop.add_request(request("stuck", max_tokens=50))
        assert (await asyncio.wait_for(queue.get(), 5)).new_token_ids == [SAMPLED_TOKEN]
        worker.hang.set()  # the next step never returns (SIGSTOP)
        await wait_for_async(lambda: worker.hung_steps == 1, what="a hung step")
        worker.status, worker.back = WorkerStatus.UNREACHABLE, asyncio.Event()
        await monitor.probe_once()
        items = await outputs_of(queue)
        assert isinstance(items[-1], WorkerUnavailable) and "does not answer" in str(items[-1])
        assert loop.readiness.has(NotReady.WORKER_LOST) and loop.num_live_requests == 0
        worker.hang.clear()
        worker.status = WorkerStatus.SERVING
        worker.back.set()  # SIGCONT: the same incarnation answers again
        await wait_for_async(lambda: loop.ready, what="recovery")
        outputs = await outputs_of(loop.add_request(request("after")))
    assert outputs[-1].finish_reason is FinishReason.LENGTH
    assert any("stuck" in s.finished_req_ids for s in worker.steps)  # the same incarnation drops its mirror


@pytest.mark.asyncio
async def test_a_worker_that_stops_serving_takes_no_new_requests_but_finishes_the_live_ones():
    worker = FakeWorkerClient(step_delay_s=0.01)
    async with running(worker) as (loop, monitor):
        queue = loop.add_request(request("live", max_tokens=20))
        worker.status = WorkerStatus.NOT_SERVING  # draining
        await monitor.probe_once()
        with pytest.raises(ServiceNotReady, match="not serving"):
            loop.add_request(request("new"))
        outputs = await outputs_of(queue)
        assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].num_output_tokens == 20
        worker.status = WorkerStatus.SERVING
        await monitor.probe_once()
        assert loop.ready and worker.num_describes == 0  # the same worker: no recovery


@pytest.mark.asyncio
async def test_a_request_the_worker_fails_ends_alone_with_its_own_error():
    worker = FakeWorkerClient(step_delay_s=0.005)
    async with running(worker) as (loop, _):
        worker.failures = {"bias": FailedRequest("bias", "logit_bias: token id 999 is out of the vocabulary", True),
                           "nan": FailedRequest("nan", "non-finite logits", False)}
        queues = {name: loop.add_request(request(name, max_tokens=5, prompt=[i + 1, 2, 3]))
                  for i, name in enumerate(("ok1", "bias", "nan", "ok2"))}
        results = {name: await outputs_of(queue) for name, queue in queues.items()}
        assert loop.ready and worker.num_describes == 0
        assert loop.scheduler.kv.usage == 0.0 and loop.num_live_requests == 0
        loop.scheduler.kv.check_integrity()
    assert isinstance(results["bias"][-1], RequestRejected) and "logit_bias" in str(results["bias"][-1])
    assert isinstance(results["nan"][-1], RequestFailed) and "non-finite" in str(results["nan"][-1])
    for name in ("ok1", "ok2"):
        assert results[name][-1].finish_reason is FinishReason.LENGTH and results[name][-1].num_output_tokens == 5
    assert loop.scheduler.snapshot_stats().num_finished == {"error": 2, "length": 2}
