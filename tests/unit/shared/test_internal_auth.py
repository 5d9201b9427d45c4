"""The internal token on real gRPC servers: calls without it (or with another) are UNAUTHENTICATED, health is open,
the right token passes; `pagedserve serve` gives its children a random token when none is configured."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.gpu_worker.server import WorkerServicer, build_server
from pagedserve.services.internal_auth import AsyncTokenInterceptor, token_metadata
from pagedserve.services.ports import free_port
from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc
from pagedserve.services.scheduler.service import SchedulerServicer
from pagedserve.services.serve_config import SERVICES, child_command, child_environment, parse_serve_config

TOKEN = "s3cret-token"


def code_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_the_worker_refuses_calls_without_the_token_but_answers_health():
    port = free_port()
    server, health_servicer = build_server(WorkerServicer(), "127.0.0.1", port, TOKEN)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            describe = lambda metadata: stub.Describe(common_pb2.DescribeRequest(), timeout=5, metadata=metadata)
            assert code_of(lambda: describe(())) is grpc.StatusCode.UNAUTHENTICATED
            assert code_of(lambda: describe(token_metadata("wrong"))) is grpc.StatusCode.UNAUTHENTICATED
            assert code_of(lambda: describe(token_metadata(TOKEN))) is grpc.StatusCode.UNAVAILABLE  # still loading
            steps = lambda metadata: list(stub.Steps(iter([worker_pb2.StepRequest()]), timeout=5, metadata=metadata))
            assert code_of(lambda: steps(())) is grpc.StatusCode.UNAUTHENTICATED  # the scheduler's step stream too
            assert code_of(lambda: steps(token_metadata(TOKEN))) is grpc.StatusCode.UNAVAILABLE
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING  # liveness, no token needed
    finally:
        server.stop(0)


@pytest.mark.asyncio
async def test_the_scheduler_refuses_calls_without_the_token_but_answers_health():
    port = free_port()
    server = grpc.aio.server(interceptors=[AsyncTokenInterceptor(TOKEN)])
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)

            async def stats(metadata) -> grpc.StatusCode:
                try:
                    await stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=5, metadata=metadata)
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            async def generate(metadata) -> grpc.StatusCode:
                try:
                    async for _ in stub.Generate(scheduler_pb2.GenerateRequest(req_id="x", prompt_token_ids=[1]),
                                                 timeout=5, metadata=metadata):
                        pass
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            assert await stats(()) is grpc.StatusCode.UNAUTHENTICATED
            assert await generate(token_metadata("wrong")) is grpc.StatusCode.UNAUTHENTICATED
            assert await stats(token_metadata(TOKEN)) is grpc.StatusCode.UNAVAILABLE  # in: no worker yet
            assert await generate(token_metadata(TOKEN)) is grpc.StatusCode.UNAVAILABLE
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(0)


def test_serve_gives_its_children_a_random_token_unless_one_is_configured():
    first, second = parse_serve_config(["m"], environ={}), parse_serve_config(["m"], environ={})
    token = first.scheduler.internal_token
    assert len(token) >= 32 and token != second.scheduler.internal_token
    assert first.worker.internal_token == first.gateway.internal_token == token
    assert child_environment(first, {})["PAGEDSERVE_INTERNAL_TOKEN"] == token
    assert all(token not in child_command(first, name) for name in SERVICES)
    given = parse_serve_config(["m", "--internal-token", "mine"], environ={})
    assert child_environment(given, {})["PAGEDSERVE_INTERNAL_TOKEN"] == "mine"
    environ = {"PAGEDSERVE_INTERNAL_TOKEN": "env"}  # inherited by the children as it is
    assert child_environment(parse_serve_config(["m"], environ=environ), environ)["PAGEDSERVE_INTERNAL_TOKEN"] == "env"
