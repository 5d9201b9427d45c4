"""Late planning: while requests arrive, step N+1 is planned shortly before step N ends, so an arrival during N joins
N+1 (with N+1 planned as N starts, it would wait for N+2); without recent arrivals N+1 is queued as N starts."""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time

import pytest

import pagedserve.services.scheduler.engine_loop as engine_loop
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import FakeWorkerClient
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.engine_harness import outputs_of
from tests.unit.scheduler_service.test_engine_loop import request, running_loop

STEP_S = 0.05


class TimedWorker(FakeWorkerClient):
    """Records when each step was submitted and when the worker started it."""

    def __init__(self) -> None:
        super().__init__(step_delay_s=STEP_S)
        self.submitted: list[float] = []
        self.started: list[float] = []

    def submit(self, step, step_id, traceparents, step_traceparent=""):
        self.submitted.append(time.perf_counter())
        return super().submit(step, step_id, traceparents, step_traceparent)

    async def step(self, step, step_id, traceparents):
        self.started.append(time.perf_counter())
        return await super().step(step, step_id, traceparents)

    def queued_s(self, first: int, last: int) -> float:
        """Median time steps first..last-1 (0-based) waited on the worker between their submission and start."""
        return statistics.median(s - q for q, s in zip(self.submitted[first:last], self.started[first:last],
                                                      strict=True))


class SizedWorker(TimedWorker):
    """A step takes 10 ms plus 4 ms a token (a 40-token prompt step: 170 ms)."""

    async def step(self, step, step_id, traceparents):
        self.step_delay_s = 0.01 + 0.004 * step.total_num_scheduled_tokens
        return await super().step(step, step_id, traceparents)


@contextlib.asynccontextmanager
async def running(late_planning: bool, worker: TimedWorker | None = None):
    worker = worker or TimedWorker()
    async with running_loop(worker, True, late_planning=late_planning) as (loop, _):
        yield loop, worker


async def next_step_start(worker: TimedWorker) -> int:
    """Wait until the worker starts another step; its 1-based index."""
    count = len(worker.steps)
    return await wait_for_async(lambda: len(worker.steps) if len(worker.steps) > count else 0, interval_s=0.001,
                                what="another step started")


@pytest.mark.asyncio
@pytest.mark.parametrize(("late_planning", "steps_later"), [(True, 1), (False, 2)])
async def test_an_arrival_during_a_step_joins_the_next_one_when_planned_late(late_planning, steps_later):
    async with running(late_planning) as (loop, worker):
        long = loop.add_request(request("long", max_tokens=40))
        for _ in range(4):  # the step time is measured
            await next_step_start(worker)
        running_step = await next_step_start(worker)
        await outputs_of(loop.add_request(request("new", max_tokens=2)))
        first = next(i for i, step in enumerate(worker.steps, 1) if any(r.req_id == "new" for r in step.new_requests))
        assert first - running_step == steps_later
        await outputs_of(long)


@pytest.mark.asyncio
async def test_steps_queue_a_whole_step_ahead_once_arrivals_stop(monkeypatch):
    monkeypatch.setattr(engine_loop, "ARRIVALS_WINDOW_S", 0.3)  # about 6 steps
    async with running(late_planning=True) as (loop, worker):
        long = loop.add_request(request("long", max_tokens=20))
        await outputs_of(long)
    window = next(i for i, start in enumerate(worker.started) if start - worker.started[0] > 0.3)
    assert worker.queued_s(2, window - 1) < 0.6 * STEP_S  # planned late: queued for the lead only
    assert worker.queued_s(window + 1, len(worker.started)) > 0.8 * STEP_S  # queued as the one before started


def prompt_request(req_id: str, seed: int) -> GenerateRequest:
    """A 40-token prompt of its own (no prefix-cache hit shortens its step)."""
    return GenerateRequest(req_id, random.Random(seed).sample(range(100), 40), SamplingParams(max_tokens=1))


@pytest.mark.asyncio
async def test_an_arrival_during_a_long_prompt_step_joins_the_next_one():
    """The plan after a prompt step waits for that step's own expected end, not the average step's."""
    async with running(True, SizedWorker()) as (loop, worker):
        long = loop.add_request(request("long", max_tokens=60))
        for i in range(3):  # decode steps and prompt steps: the model learns what a token costs
            await next_step_start(worker)
            await outputs_of(loop.add_request(prompt_request(f"warm-{i}", i)))
        for _ in range(3):
            await next_step_start(worker)
        prompt = loop.add_request(prompt_request("prompt", 99))
        while not any(r.req_id == "prompt" for r in worker.steps[-1].new_requests):
            await next_step_start(worker)
        prompt_step = len(worker.steps)
        await asyncio.sleep(0.06)  # well inside the 170 ms step, beyond an average step's end
        await outputs_of(loop.add_request(request("new", max_tokens=2)))
        first = next(i for i, step in enumerate(worker.steps, 1) if any(r.req_id == "new" for r in step.new_requests))
        assert first - prompt_step == 1
        await outputs_of(prompt)
        await outputs_of(long)
