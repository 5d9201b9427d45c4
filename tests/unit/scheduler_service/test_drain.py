"""The scheduler's drain: no new request once it began, live ones finish, what outlives the timeout fails with an
error its client sees; and `serve` gives each service its drain timeout before it kills it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from pagedserve.services.grpc_errors import ServiceNotReady
from pagedserve.services.launcher import stop_timeouts
from pagedserve.services.scheduler.drain import drain
from pagedserve.services.scheduler.integrity import check_integrity
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.readiness import NotReady, Readiness
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.serve_config import parse_serve_config
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.engine_harness import outputs_of, running_engine


def request(req_id: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(req_id, [hash(req_id) % 90 + 1, 2, 3], SamplingParams(max_tokens=max_tokens))


@contextlib.asynccontextmanager
async def running(step_delay_s: float):
    readiness = Readiness()
    async with running_engine(FakeWorkerClient(step_delay_s), readiness=readiness) as loop:
        yield loop, readiness


@pytest.mark.asyncio
async def test_a_drain_refuses_new_requests_and_lets_the_live_ones_finish():
    async with running(step_delay_s=0.005) as (loop, readiness):
        queues = [loop.add_request(request(f"r{i}", max_tokens=20 + i)) for i in range(8)]
        draining = asyncio.create_task(drain(loop, readiness, timeout_s=30))
        await asyncio.sleep(0)
        assert readiness.has(NotReady.DRAINING)
        with pytest.raises(ServiceNotReady, match="draining") as refused:
            loop.add_request(request("late", max_tokens=2))
        assert refused.value.retry_after_s >= 1
        results = [await outputs_of(queue) for queue in queues]
        assert await draining == 0
    assert [r[-1].finish_reason for r in results] == [FinishReason.LENGTH] * 8
    assert [r[-1].num_output_tokens for r in results] == [20 + i for i in range(8)]


@pytest.mark.asyncio
async def test_what_outlives_the_drain_timeout_fails_with_an_error():
    async with running(step_delay_s=0.01) as (loop, readiness):
        queue = loop.add_request(request("endless", max_tokens=100))
        assert await drain(loop, readiness, timeout_s=0.2) == 1
        got = await outputs_of(queue)
        assert isinstance(got[-1], ServiceNotReady) and "drain timeout" in str(got[-1])
        assert loop.num_live_requests == 0 and loop.scheduler.kv.usage == 0.0


def test_serve_waits_out_each_drain_before_it_kills_a_service():
    timeouts = stop_timeouts(parse_serve_config(["m", "--drain-timeout-s", "30"], environ={}))
    assert timeouts["scheduler"] == timeouts["worker"] == 40.0
    assert timeouts["gateway"] >= 15.0


@pytest.mark.asyncio
async def test_a_drain_hands_off_what_would_outlive_it_before_its_timeout_and_frees_every_block():
    """A 60 s drain with a 59.9 s hand-off margin while the worker is slow (0.5 s a step, requests of 40 tokens):
    the requests end with HANDOFF after the tokens they streamed, long before the timeout (the drain returns with none
    failed), the waiting one too; a step in flight's tokens, once back, are dropped, and the worker is told to drop
    its mirrors."""
    async with running(step_delay_s=0.01) as (loop, readiness):
        loop.scheduler = Scheduler(SchedulerConfig(max_num_seqs=2), DESCRIPTION)
        queues = [loop.add_request(request(f"r{i}", max_tokens=40)) for i in range(3)]
        first = await asyncio.wait_for(queues[0].get(), 10)  # the first two are running and streaming
        loop.worker.step_delay_s = 0.5  # no request can finish for 20 s now
        draining = asyncio.create_task(drain(loop, readiness, timeout_s=60, handoff_margin_s=59.9))
        await asyncio.sleep(0)
        with pytest.raises(ServiceNotReady, match="draining"):
            loop.add_request(request("late", max_tokens=2))
        results = [await outputs_of(queue) for queue in queues]
        assert await asyncio.wait_for(draining, 30) == 0
        loop.worker.step_delay_s = 0.01
        # the engine tells the worker to drop the mirrors with its next step
        await wait_for_async(lambda: not loop.worker.mirrors, what="the worker's mirrors dropped")
        report = check_integrity(loop.scheduler, loop.live_req_ids)
        assert loop.worker.mirrors == {}
    results[0].insert(0, first)
    assert [r[-1].finish_reason for r in results] == [FinishReason.HANDOFF] * 3
    streamed = [sum(len(item.new_token_ids) for item in r) for r in results]
    assert [r[-1].num_output_tokens for r in results] == streamed
    assert streamed[0] >= 1 and streamed[2] == 0 and max(streamed) < 40
    assert report.ok and report.num_used_blocks == 0 and report.num_live_requests == 0, report
    assert loop.scheduler.snapshot_stats().num_finished == {"handoff": 3}
    exposition = SchedulerMetrics(lambda: (loop.scheduler.snapshot_stats(), "fake")).render().decode()
    assert 'pagedserve_request_success_total{finished_reason="handoff",model_name="fake"} 3.0' in exposition


@pytest.mark.asyncio
async def test_a_hand_off_margin_past_the_drain_timeout_hands_off_at_once():
    async with running(step_delay_s=0.01) as (loop, readiness):
        queue = loop.add_request(request("r", max_tokens=40))
        assert await asyncio.wait_for(drain(loop, readiness, timeout_s=1, handoff_margin_s=5), 30) == 0
        got = await outputs_of(queue)
    assert got[-1].finish_reason is FinishReason.HANDOFF and loop.scheduler.kv.usage == 0.0


def test_the_hand_off_margin_is_a_scheduler_flag_with_a_default_and_refuses_a_negative():
    assert parse_serve_config(["m"], environ={}).scheduler.drain_handoff_margin_s == 5.0
    assert parse_serve_config(["m", "--drain-handoff-margin-s", "0"], environ={}).scheduler.drain_handoff_margin_s == 0
    config = parse_serve_config(["m"], environ={"PAGEDSERVE_DRAIN_HANDOFF_MARGIN_S": "2.5"}).scheduler
    assert config.drain_handoff_margin_s == 2.5
    with pytest.raises(ValueError, match="drain_handoff_margin_s must not be negative"):
        dataclasses.replace(config, drain_handoff_margin_s=-1.0)
