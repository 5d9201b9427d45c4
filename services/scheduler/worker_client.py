"""The scheduler's asyncio gRPC client to its worker: wait until ready, describe, and the steps on one stream."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.internal_auth import token_metadata
from pagedserve.services.internal_tls import InternalTLSConfig, aio_channel
from pagedserve.services.proto_convert.common import description_from_pb, structured_output_to_pb
from pagedserve.services.proto_convert.worker_contract import step_input_to_pb
from pagedserve.services.proto_gen import common_pb2, worker_pb2, worker_pb2_grpc
from pagedserve.services.scheduler.step_stream import StepStream
from pagedserve.services.scheduler.worker_monitor import WorkerProbe, WorkerStatus
from pagedserve.shared.step_protocol import ModelDescription, StepInput, StepOutput
from pagedserve.shared.structured_output import StructuredOutput

log = logging.getLogger(__name__)
MAX_MESSAGE_BYTES = 64 * 1024**2
WORKER_SERVICE = "pagedserve.v1.WorkerService"
GRAMMAR_COMPILE_TIMEOUT_S = 120.0  # the gateway refuses grammars that take over its own (shorter) compile timeout


class WorkerClient:
    def __init__(self, address: str, step_timeout_s: float, internal_token: str = "",
                 tls: InternalTLSConfig | None = None) -> None:
        """`tls`: dial over TLS when it dials TLS (services/internal_tls.py); None: plaintext."""
        self.address = address
        self.step_timeout_s = step_timeout_s
        self.auth = token_metadata(internal_token)
        self.channel = aio_channel(address, tls or InternalTLSConfig(), [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
        self.stub = worker_pb2_grpc.WorkerServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self._stream: StepStream | None = None

    async def wait_until_ready(self, initial_backoff_s: float = 0.1, max_backoff_s: float = 2.0,
                               log_interval_s: float = 10.0) -> ModelDescription:
        """Retry with exponential backoff until the worker's health says SERVING; then describe it."""
        backoff_s, start_s, next_log_s = initial_backoff_s, time.monotonic(), time.monotonic() + log_interval_s
        while True:
            try:
                reply = await self.health.Check(health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return description_from_pb(await self.stub.Describe(common_pb2.DescribeRequest(), timeout=10,
                                                                        metadata=self.auth))
                reason = "loading"
            except grpc.aio.AioRpcError as exc:
                reason = exc.code().name
            if time.monotonic() >= next_log_s:
                log.info("waiting for the worker at %s (%s) for %.0fs", self.address, reason,
                         time.monotonic() - start_s)
                next_log_s = time.monotonic() + log_interval_s
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, max_backoff_s)

    async def probe(self, timeout_s: float) -> WorkerProbe:
        """The worker's readiness and, when it serves, its description (incarnation and pool); never raises."""
        try:
            reply = await self.health.Check(health_pb2.HealthCheckRequest(service=WORKER_SERVICE), timeout=timeout_s)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return WorkerProbe(WorkerStatus.NOT_SERVING)
            description = await self.stub.Describe(common_pb2.DescribeRequest(), timeout=timeout_s,
                                                   metadata=self.auth)
        except grpc.aio.AioRpcError as exc:
            return WorkerProbe(WorkerStatus.UNREACHABLE, detail=exc.code().name)
        return WorkerProbe(WorkerStatus.SERVING, description_from_pb(description))

    def submit(self, step: StepInput, step_id: int, traceparents: Mapping[str, str],
               step_traceparent: str = "") -> asyncio.Future[StepOutput]:
        """Send the step now on the Steps stream (opened on first use); the future resolves to its output once the
        steps before it are answered, or raises grpc.aio.AioRpcError when the worker fails or is unreachable (then
        every later step fails too, until `reset_stream`)."""
        if self._stream is None:
            self._stream = StepStream(self.stub, metadata=list(self.auth))
        return self._stream.submit(step_input_to_pb(step, step_id, traceparents, step_traceparent))

    async def reset_stream(self) -> None:
        """Close the step stream (its pending steps fail); the next submit opens a new one."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await stream.close()

    async def prepare_grammar(self, structured: StructuredOutput) -> None:
        """Returns once the worker compiled the grammar; raises grpc.aio.AioRpcError (INVALID_ARGUMENT: refused)."""
        await self.stub.PrepareGrammar(worker_pb2.PrepareGrammarRequest(
            structured_output=structured_output_to_pb(structured)), timeout=GRAMMAR_COMPILE_TIMEOUT_S,
            metadata=self.auth)

    async def close(self) -> None:
        await self.reset_stream()
        await self.channel.close()
