"""--step-progress-timeout-s over real gRPC: a worker that answers health and Describe but never finishes its step
(a deadlock in the forward) has the step cut at the deadline; the request fails, the scheduler is not ready while
it recovers, and it serves again once the worker does."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.grpc_errors import WorkerUnavailable
from pagedserve.services.ports import free_port
from pagedserve.services.proto_convert.common import description_to_pb
from pagedserve.services.proto_convert.worker_contract import step_input_from_pb, step_output_to_pb
from pagedserve.services.proto_gen import worker_pb2_grpc
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.worker_client import WorkerClient
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import StepOutput
from tests.support.fake_worker_client import DESCRIPTION, SAMPLED_TOKEN
from tests.support.tasks import running
from tests.support.waiting import wait_for_async


class DeadlockingWorker(worker_pb2_grpc.WorkerServiceServicer):
    """Samples a fixed token, except that while `stuck` its steps never end (health and Describe still answer)."""

    def __init__(self) -> None:
        self.stuck = False

    async def Describe(self, request, context):  # noqa: N802 - gRPC method name
        return description_to_pb(DESCRIPTION)

    async def Steps(self, request_iterator, context):  # noqa: N802
        async for request in request_iterator:
            yield await self.Step(request, context)

    async def Step(self, request, context):  # noqa: N802
        step = step_input_from_pb(request)
        while self.stuck:
            await asyncio.sleep(0.01)
        output = StepOutput(incarnation_id=DESCRIPTION.incarnation_id)
        for req_id in step.num_scheduled_tokens:
            output.req_ids.append(req_id)
            output.sampled_token_ids.append(SAMPLED_TOKEN)
            output.logprobs.append(None)
        return step_output_to_pb(output)


@contextlib.asynccontextmanager
async def worker_server(servicer: DeadlockingWorker):
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set("pagedserve.v1.WorkerService", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


@pytest.mark.asyncio
async def test_a_step_past_its_deadline_fails_its_requests_and_the_scheduler_recovers():
    servicer = DeadlockingWorker()
    async with worker_server(servicer) as address:
        client = WorkerClient(address, step_timeout_s=0.5)
        # prompts of one token: every step samples, so the request finishes after max_tokens steps
        scheduler = Scheduler(SchedulerConfig(), dataclasses.replace(DESCRIPTION, max_model_len=64))
        loop = EngineLoop(scheduler, client, NullStateWriter())
        try:
            async with running(loop.run()):
                servicer.stuck = True
                queue = loop.add_request(GenerateRequest("stuck", [5], SamplingParams(max_tokens=3)))
                error = await asyncio.wait_for(queue.get(), 10)
                assert isinstance(error, WorkerUnavailable) and "DEADLINE_EXCEEDED" in str(error)
                servicer.stuck = False
                await wait_for_async(lambda: loop.ready, what="the loop ready again")
                queue = loop.add_request(GenerateRequest("after", [6], SamplingParams(max_tokens=3)))
                outputs = [await asyncio.wait_for(queue.get(), 10) for _ in range(3)]
                assert outputs[-1].finish_reason is FinishReason.LENGTH
        finally:
            await client.close()
