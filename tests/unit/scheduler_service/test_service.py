"""The scheduler servicer: streams chunks, rejects with INVALID_ARGUMENT, and a rejection never hurts another stream."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pagedserve.services.proto_convert.scheduler_contract import generate_request_to_pb
from pagedserve.services.proto_gen import scheduler_pb2
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.service import SchedulerServicer
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient
from tests.support.tasks import running


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple | None = None

    def invocation_metadata(self):
        return ()

    async def abort(self, code, details, trailing_metadata=()):
        self.aborted = (code, details)
        self.trailing_metadata = trailing_metadata
        raise Aborted


def generate_pb(req_id: str, max_tokens: int) -> scheduler_pb2.GenerateRequest:
    return generate_request_to_pb(GenerateRequest(req_id, [5, 6, 7], SamplingParams(max_tokens=max_tokens)))


@pytest.mark.asyncio
async def test_duplicate_id_is_rejected_without_aborting_the_live_request():
    servicer = SchedulerServicer()
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(step_delay_s=0.005),
                                 servicer.state)
    async with running(servicer.engine.run()):
        stream = servicer.Generate(generate_pb("dup", max_tokens=20), FakeContext())
        first = await stream.__anext__()
        context = FakeContext()
        with pytest.raises(Aborted):
            async for _ in servicer.Generate(generate_pb("dup", max_tokens=2), context):
                pass
        assert context.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT and "already in use" in context.aborted[1]
        async def rest() -> list:
            return [chunk async for chunk in stream]

        chunks = [first] + await asyncio.wait_for(rest(), 5)  # the live stream still gets every token
        assert chunks[-1].finish_reason == scheduler_pb2.FINISH_REASON_LENGTH
        assert sum(len(c.token_ids) for c in chunks) == 20
        stats = servicer.stats()
        assert (stats.num_running, stats.kv_usage, stats.num_finished) == (0, 0.0, {"length": 1})


@pytest.mark.asyncio
async def test_not_ready_is_unavailable_and_bad_params_invalid():
    servicer, context = SchedulerServicer(), FakeContext()
    with pytest.raises(Aborted):
        await servicer.GetStats(scheduler_pb2.GetStatsRequest(), context)
    assert context.aborted[0] is grpc.StatusCode.UNAVAILABLE
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), servicer.state)
    bad = scheduler_pb2.GenerateRequest(req_id="x", prompt_token_ids=[1])
    bad.sampling.top_p = 2.0
    context = FakeContext()
    with pytest.raises(Aborted):
        async for _ in servicer.Generate(bad, context):
            pass
    assert context.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT and "top_p" in context.aborted[1]


@pytest.mark.asyncio
async def test_identify_answers_before_the_worker_is_ready():
    servicer = SchedulerServicer("replica-7", publishes_prefix_blocks=True)
    identity = await servicer.Identify(scheduler_pb2.IdentifyRequest(), FakeContext())
    assert (identity.instance_id, identity.publishes_prefix_blocks) == ("replica-7", True)


@pytest.mark.asyncio
async def test_integrity_report_counts_every_block_and_names_a_leak():
    servicer = SchedulerServicer()
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), servicer.state)
    async with running(servicer.engine.run()):
        request = generate_request_to_pb(GenerateRequest("r", list(range(1, 10)), SamplingParams(max_tokens=2)))
        chunks = [chunk async for chunk in servicer.Generate(request, FakeContext())]
        assert chunks[-1].finish_reason == scheduler_pb2.FINISH_REASON_LENGTH
        report = await servicer.CheckIntegrity(scheduler_pb2.CheckIntegrityRequest(), FakeContext())
        assert (report.ok, report.problem, report.num_blocks, report.num_used_blocks, report.num_cached_blocks,
                report.num_free_blocks, report.num_live_requests, report.worker_incarnation_id) == (
            True, "", 32, 0, 2, 30, 0, "first")  # 10 tokens computed: two full blocks stay cached
        servicer.engine.scheduler.kv.blocks_of["gone"] = []  # a finished request still listed as a block holder
        report = await servicer.CheckIntegrity(scheduler_pb2.CheckIntegrityRequest(), FakeContext())
        assert not report.ok and "finished requests hold blocks: {'gone'}" in report.problem


@pytest.mark.asyncio
async def test_a_continuation_streams_only_new_tokens_and_one_with_nothing_left_is_invalid():
    servicer = SchedulerServicer()
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), servicer.state)
    async with running(servicer.engine.run()):
        resumed = generate_pb("r", max_tokens=10)
        resumed.resumed_output_token_ids.extend([9, 8, 7, 6])
        chunks = [chunk async for chunk in servicer.Generate(resumed, FakeContext())]
        assert sum(len(c.token_ids) for c in chunks) == 6  # max_tokens counts the 4 resumed ones
        assert [c.num_output_tokens for c in chunks] == list(range(5, 11))
        assert {c.num_prompt_tokens for c in chunks} == {3}
        assert chunks[-1].finish_reason == scheduler_pb2.FINISH_REASON_LENGTH
        done = generate_pb("done", max_tokens=4)
        done.resumed_output_token_ids.extend([9, 8, 7, 6])
        context = FakeContext()
        with pytest.raises(Aborted):
            async for _ in servicer.Generate(done, context):
                pass
        assert context.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT
        assert "resumed_output_token_ids has 4 tokens but max_tokens is 4" in context.aborted[1]
        assert servicer.engine.num_live_requests == 0 and servicer.stats().kv_usage == 0.0
