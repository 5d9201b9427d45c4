"""Constrained requests wait for the worker's compile outside the steps: others stream meanwhile."""

from __future__ import annotations

import asyncio

import pytest

from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.support.fake_worker_client import FakeWorkerClient
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.engine_harness import outputs_of
from tests.unit.scheduler_service.test_engine_loop import request, running_loop


def constrained(req_id: str, spec: str = "(yes|no)") -> GenerateRequest:
    return GenerateRequest(req_id, [10, 11, 12, 13], SamplingParams(
        max_tokens=2, temperature=0.0, structured_output=StructuredOutput(StructuredOutputKind.REGEX, spec)))


def scheduled_ids(worker: FakeWorkerClient) -> set[str]:
    return {req_id for step in worker.steps for req_id in step.num_scheduled_tokens}


@pytest.mark.asyncio
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
async def test_a_slow_compile_holds_back_only_its_request(async_scheduling: bool):
    worker = FakeWorkerClient()
    worker.grammar_gate = asyncio.Event()
    async with running_loop(worker, async_scheduling) as (loop, _):
        slow = loop.add_request(constrained("slow"))
        free = loop.add_request(request("free", max_tokens=5))
        assert (await outputs_of(free))[-1].num_output_tokens == 5  # streamed to the end while the compile ran
        assert "slow" not in scheduled_ids(worker) and slow.empty()
        assert loop.scheduler.snapshot_stats().num_waiting == 1  # counted as waiting
        worker.grammar_gate.set()
        assert (await outputs_of(slow))[-1].num_output_tokens == 2
    assert worker.prepared_grammars == ["(yes|no)"]
    loop.scheduler.kv.check_integrity()


@pytest.mark.asyncio
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
async def test_one_compile_call_per_grammar(async_scheduling: bool):
    worker = FakeWorkerClient()
    worker.grammar_gate = asyncio.Event()
    async with running_loop(worker, async_scheduling) as (loop, _):
        queues = [loop.add_request(constrained(f"r{i}")) for i in range(3)]
        await wait_for_async(lambda: worker.prepared_grammars, what="a compile under way")
        worker.grammar_gate.set()
        for queue in queues:
            await outputs_of(queue)
        await outputs_of(loop.add_request(constrained("later")))  # known to the worker: no call
        await outputs_of(loop.add_request(constrained("other", spec="(a|b)")))
    assert worker.prepared_grammars == ["(yes|no)", "(a|b)"]


@pytest.mark.asyncio
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
async def test_a_refused_grammar_fails_its_request_only(async_scheduling: bool):
    worker = FakeWorkerClient()
    worker.refused_grammars.add("a(b")
    async with running_loop(worker, async_scheduling) as (loop, _):
        bad = loop.add_request(constrained("bad", spec="a(b"))
        error = await asyncio.wait_for(bad.get(), 5)
        assert isinstance(error, RequestRejected) and "cannot be compiled" in str(error)
        assert (await outputs_of(loop.add_request(request("fine"))))[-1].finished
        assert not loop.scheduler.has_unfinished_requests() and loop.num_live_requests == 0
    assert "bad" not in scheduled_ids(worker)


@pytest.mark.asyncio
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
async def test_a_request_aborted_while_compiling_never_runs(async_scheduling: bool):
    worker = FakeWorkerClient()
    worker.grammar_gate = asyncio.Event()
    async with running_loop(worker, async_scheduling) as (loop, _):
        loop.add_request(constrained("gone"))
        await wait_for_async(lambda: worker.prepared_grammars, what="its compile under way")
        loop.abort_request("gone")
        assert not loop.scheduler.has_unfinished_requests()
        worker.grammar_gate.set()
        await outputs_of(loop.add_request(request("after")))
    assert "gone" not in scheduled_ids(worker)
    loop.scheduler.kv.check_integrity()
