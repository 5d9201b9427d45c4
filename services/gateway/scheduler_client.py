"""The gateway's asyncio gRPC client to the scheduler: generate streams, stats, describe, health."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.proto_convert.common import description_from_pb
from services.proto_convert.scheduler_contract import generate_request_to_pb, output_from_chunk, stats_from_pb
from services.proto_gen import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.scheduler.scheduler_stats import SchedulerStats
from shared.request_io import GenerateRequest, RequestOutput
from shared.step_protocol import ModelDescription
from shared.tracing import outgoing_metadata

SCHEDULER_SERVICE = "pagedserve.v1.SchedulerService"


class SchedulerClient:
    def __init__(self, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel: grpc.aio.Channel | None = None

    def connect(self) -> None:
        """Open the channel; call it inside the running event loop (an aio channel binds to its loop)."""
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs until it finishes. Closing the iterator early cancels the call, which aborts the
        request in the scheduler and frees its blocks. Raises grpc.aio.AioRpcError."""
        call = self.stub.Generate(generate_request_to_pb(request), metadata=outgoing_metadata())
        try:
            async for chunk in call:
                yield output_from_chunk(request.req_id, chunk)
        finally:
            call.cancel()  # a no-op once the stream ended

    async def is_serving(self) -> bool:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE),
                                            timeout=self.timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def describe(self) -> ModelDescription:
        return description_from_pb(await self.stub.Describe(common_pb2.DescribeRequest(), timeout=self.timeout_s))

    async def get_stats(self) -> SchedulerStats:
        return stats_from_pb(await self.stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=self.timeout_s))

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
