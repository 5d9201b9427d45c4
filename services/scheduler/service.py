"""The scheduler's gRPC servicer: Generate streams, GetStats, Describe, Identify. Protobuf stops here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from opentelemetry.trace import SpanKind

from pagedserve.services.grpc_errors import ServiceNotReady, map_errors
from pagedserve.services.proto_convert.common import description_to_pb
from pagedserve.services.proto_convert.scheduler_contract import (
    generate_request_from_pb,
    integrity_to_pb,
    output_to_chunk,
    stats_to_pb,
)
from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.integrity import check_integrity
from pagedserve.services.scheduler.redis_state import NullStateWriter, RedisStateWriter
from pagedserve.shared.scheduler_stats import SchedulerStats
from pagedserve.shared.tracing import (
    gen_ai_request_attributes,
    get_tracer,
    incoming_context,
    record_error,
    traceparent_of,
)

log = logging.getLogger(__name__)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, instance_id: str = "", publishes_prefix_blocks: bool = False) -> None:
        self.instance_id = instance_id
        self.publishes_prefix_blocks = publishes_prefix_blocks
        self.engine: EngineLoop | None = None  # set once the worker answered
        self.state: RedisStateWriter | NullStateWriter = NullStateWriter()

    def _engine(self) -> EngineLoop:
        """The engine once the worker first answered; Generate also needs it ready (EngineLoop.add_request)."""
        if self.engine is None:
            raise ServiceNotReady("the scheduler is waiting for its worker")
        return self.engine

    @map_errors
    async def Generate(self, request: scheduler_pb2.GenerateRequest, context  # noqa: N802 - gRPC method name
                       ) -> AsyncIterator[scheduler_pb2.GenerateChunk]:
        engine = self._engine()
        generate = generate_request_from_pb(request)
        span = get_tracer().start_span(
            "scheduler.generate", context=incoming_context(context.invocation_metadata()), kind=SpanKind.SERVER,
            attributes={"req_id": generate.req_id, "gen_ai.request.model": engine.scheduler.description.model_name,
                        "gen_ai.usage.input_tokens": len(generate.prompt_token_ids),
                        "priority": generate.priority, "tenant": generate.tenant,
                        "num_resumed_tokens": len(generate.resumed_output_token_ids),
                        **gen_ai_request_attributes(generate.sampling)})
        try:
            queue = engine.add_request(generate, span, traceparent_of(span))
        except BaseException as exc:  # rejected: nothing to abort (the id may belong to another live request)
            record_error(span, exc)
            span.end()
            raise
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    span.set_attributes({"gen_ai.response.finish_reasons": [item.finish_reason.value],
                                         "gen_ai.usage.output_tokens": item.num_output_tokens,
                                         "num_cached_tokens": item.num_cached_tokens})
                yield output_to_chunk(item)
                if item.finished:
                    return
        except Exception as exc:
            record_error(span, exc)
            raise
        finally:  # also on cancellation: the client went away, free the blocks now
            engine.abort_request(generate.req_id)
            span.end()

    @map_errors
    async def GetStats(self, request, context) -> scheduler_pb2.SchedulerStats:  # noqa: N802
        return stats_to_pb(self.stats())

    @map_errors
    async def Describe(self, request, context) -> common_pb2.ModelDescription:  # noqa: N802
        return description_to_pb(self._engine().scheduler.description)

    @map_errors
    async def CheckIntegrity(self, request, context) -> scheduler_pb2.IntegrityReport:  # noqa: N802
        engine = self._engine()
        return integrity_to_pb(check_integrity(engine.scheduler, engine.live_req_ids))

    @map_errors
    async def Identify(self, request, context) -> scheduler_pb2.SchedulerIdentity:  # noqa: N802
        return scheduler_pb2.SchedulerIdentity(instance_id=self.instance_id,
                                               publishes_prefix_blocks=self.publishes_prefix_blocks)

    def stats(self) -> SchedulerStats:
        return self.snapshot(self._engine())

    def snapshot(self, engine: EngineLoop) -> SchedulerStats:
        """The scheduler's snapshot with its Redis writer's counters filled in (also while the worker is lost)."""
        return replace(engine.scheduler.snapshot_stats(), num_state_writes=self.state.num_writes,
                       num_state_writes_dropped=self.state.num_dropped, state_store_connected=self.state.connected)
