"""The scheduler's drain: no new request once it began, live ones finish, what outlives the timeout fails with an
error its client sees; and `serve` gives each service its drain timeout before it kills it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from services.grpc_errors import ServiceNotReady
from services.launcher import stop_timeouts
from services.scheduler.drain import drain
from services.scheduler.readiness import NotReady, Readiness
from services.serve_config import parse_serve_config
from shared.request_io import FinishReason, GenerateRequest
from shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import FakeWorkerClient
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
