"""The engine loop under more arrivals than it can queue: the excess is refused at once with a Retry-After, and
every request it accepted finishes; none is dropped later for load."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from pagedserve.services.scheduler.admission import AdmissionConfig, AdmissionControl, Overloaded
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient


@pytest.mark.asyncio
async def test_a_burst_over_the_queue_bound_is_refused_and_every_accepted_request_finishes():
    admission = AdmissionControl(AdmissionConfig(max_waiting_requests=4))
    loop = EngineLoop(Scheduler(SchedulerConfig(max_num_seqs=2), DESCRIPTION), FakeWorkerClient(step_delay_s=0.002),
                      NullStateWriter(), admission=admission)
    task = asyncio.create_task(loop.run())
    try:
        accepted, refused = [], []
        for i in range(40):  # arrivals a little faster than the loop serves them
            request = GenerateRequest(f"r{i}", [i % 90 + 1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0))
            try:
                accepted.append(loop.add_request(request))
            except Overloaded as exc:
                refused.append(exc)
            if i % 4 == 3:
                await asyncio.sleep(0.002)
        assert accepted and refused and len(accepted) + len(refused) == 40
        assert all(exc.retry_after_s >= 1 and "requests are waiting" in str(exc) for exc in refused)
        for queue in accepted:
            outputs = []
            while not outputs or not outputs[-1].finished:
                outputs.append(await asyncio.wait_for(queue.get(), 5))
            assert outputs[-1].finish_reason is FinishReason.LENGTH and outputs[-1].num_output_tokens == 4
        assert admission.num_refused == len(refused)
        assert loop.admission.estimator.step_time_s is not None  # the loop feeds the estimator
        loop.scheduler.kv.check_integrity()
        assert loop.num_live_requests == 0 and loop.scheduler.kv.usage == 0.0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
