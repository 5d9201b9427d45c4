"""The gateway's asyncio gRPC client to the scheduler: generate streams, stats, describe, health."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.gateway.routing.replicas import Health, ReplicaIdentity
from pagedserve.services.internal_auth import token_metadata
from pagedserve.services.internal_tls import InternalTLSConfig, aio_channel
from pagedserve.services.proto_convert.common import description_from_pb
from pagedserve.services.proto_convert.scheduler_contract import (
    generate_request_to_pb,
    output_from_chunk,
    stats_from_pb,
)
from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from pagedserve.shared.request_io import GenerateRequest, RequestOutput
from pagedserve.shared.scheduler_stats import SchedulerStats
from pagedserve.shared.step_protocol import ModelDescription
from pagedserve.shared.tracing import outgoing_metadata

SCHEDULER_SERVICE = "pagedserve.v1.SchedulerService"
# A scheduler that comes back is reconnected within about 2 s (gRPC's default backoff grows to 120 s).
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                    ("grpc.max_reconnect_backoff_ms", 2000)]


class SchedulerClient:
    def __init__(self, address: str, timeout_s: float, health_timeout_s: float | None = None,
                 internal_token: str = "", tls: InternalTLSConfig | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.health_timeout_s = timeout_s if health_timeout_s is None else health_timeout_s
        self.auth = token_metadata(internal_token)  # every call but health carries it
        self.tls = InternalTLSConfig() if tls is None else tls
        self.channel: grpc.aio.Channel | None = None
        self._calls: set[grpc.aio.UnaryStreamCall] = set()  # open Generate calls
        self._abandoned: set[grpc.aio.UnaryStreamCall] = set()  # of those, cancelled by abandon_calls

    def connect(self) -> None:
        """Open the channel; call it inside the running event loop (an aio channel binds to its loop)."""
        self.channel = aio_channel(self.address, self.tls, _CHANNEL_OPTIONS)
        self.stub = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        """The request's outputs until it finishes. Closing the iterator early cancels the call, which aborts the
        request in the scheduler and frees its blocks. Raises grpc.aio.AioRpcError."""
        call = self.stub.Generate(generate_request_to_pb(request),
                                  metadata=(*outgoing_metadata(), *self.auth))
        self._calls.add(call)
        try:
            async for chunk in call:
                yield output_from_chunk(request.req_id, chunk)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if call in self._abandoned and task is not None and not task.cancelling():
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                           f"the scheduler at {self.address} stopped answering") from None
            raise
        finally:
            call.cancel()  # a no-op once the stream ended
            self._calls.discard(call)
            self._abandoned.discard(call)

    def abandon_calls(self) -> None:
        """Cancel every open Generate call; each fails in its reader as UNAVAILABLE (the scheduler stopped
        answering), so that the router retries it elsewhere or ends its stream with an error."""
        self._abandoned.update(self._calls)
        for call in list(self._calls):
            call.cancel()

    async def check_health(self) -> Health:
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE),
                                            timeout=self.health_timeout_s)
        except grpc.aio.AioRpcError:
            return Health.NO_ANSWER
        return Health.SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else Health.NOT_SERVING

    async def describe(self) -> ModelDescription:
        return description_from_pb(await self.stub.Describe(common_pb2.DescribeRequest(), timeout=self.timeout_s,
                                                            metadata=self.auth))

    async def identify(self) -> ReplicaIdentity:
        reply = await self.stub.Identify(scheduler_pb2.IdentifyRequest(), timeout=self.timeout_s, metadata=self.auth)
        return ReplicaIdentity(reply.instance_id or self.address, reply.publishes_prefix_blocks)

    async def get_stats(self) -> SchedulerStats:
        return stats_from_pb(await self.stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=self.timeout_s,
                                                      metadata=self.auth))

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
