"""The gateway's scheduler client against a real gRPC server: abandoned calls fail as UNAVAILABLE, while the
caller's own cancel stays a cancel; health is three-valued."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.gateway.routing.replicas import Health
from pagedserve.services.gateway.routing.scheduler_client import SCHEDULER_SERVICE, SchedulerClient
from pagedserve.services.proto_gen import scheduler_pb2, scheduler_pb2_grpc
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams


class StallingScheduler(scheduler_pb2_grpc.SchedulerServiceServicer):
    """Sends one chunk, then never another."""

    async def Generate(self, request, context):  # noqa: N802
        yield scheduler_pb2.GenerateChunk(token_ids=[5], num_prompt_tokens=1, num_output_tokens=1)
        await asyncio.sleep(3600)


@contextlib.asynccontextmanager
async def server_and_client():
    server = grpc.aio.server()
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(StallingScheduler(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = SchedulerClient(f"127.0.0.1:{port}", timeout_s=5, health_timeout_s=1)
    client.connect()
    try:
        yield server, health_servicer, client
    finally:
        await client.close()
        await server.stop(0)


async def first_then_rest(client: SchedulerClient, first: asyncio.Event) -> None:
    request = GenerateRequest("r", [1, 2], SamplingParams(max_tokens=5))
    async for _ in client.generate(request):
        first.set()


@pytest.mark.asyncio
async def test_abandoned_calls_fail_unavailable_and_a_callers_cancel_stays_a_cancel():
    async with server_and_client() as (_, _, client):
        first = asyncio.Event()
        reader = asyncio.create_task(first_then_rest(client, first))
        await asyncio.wait_for(first.wait(), 5)
        client.abandon_calls()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await asyncio.wait_for(reader, 5)
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE and "stopped answering" in raised.value.details()

        first.clear()
        reader = asyncio.create_task(first_then_rest(client, first))
        await asyncio.wait_for(first.wait(), 5)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        assert not client._calls


@pytest.mark.asyncio
async def test_health_is_serving_not_serving_or_no_answer():
    async with server_and_client() as (server, health_servicer, client):
        await health_servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await client.check_health() is Health.NOT_SERVING
        await health_servicer.set(SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        assert await client.check_health() is Health.SERVING
        await server.stop(0)
        assert await client.check_health() is Health.NO_ANSWER
