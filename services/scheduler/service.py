"""The scheduler's gRPC servicer: Generate streams, GetStats, Describe. Protobuf stops here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from services.grpc_errors import ServiceNotReady, map_errors
from services.proto_convert.common import description_to_pb
from services.proto_convert.scheduler_contract import generate_request_from_pb, output_to_chunk, stats_to_pb
from services.proto_gen import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.scheduler.engine_loop import EngineLoop
from services.scheduler.redis_state import NullStateWriter, RedisStateWriter
from services.scheduler.service_stats import ServiceStats
from shared.tracing import get_tracer, incoming_context, traceparent_of

log = logging.getLogger(__name__)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self) -> None:
        self.engine: EngineLoop | None = None  # set once the worker answered
        self.state: RedisStateWriter | NullStateWriter = NullStateWriter()

    def _ready(self) -> EngineLoop:
        if self.engine is None or not self.engine.ready:
            raise ServiceNotReady("the scheduler is waiting for its worker")
        return self.engine

    @map_errors
    async def Generate(self, request: scheduler_pb2.GenerateRequest, context  # noqa: N802 - gRPC method name
                       ) -> AsyncIterator[scheduler_pb2.GenerateChunk]:
        engine = self._ready()
        generate = generate_request_from_pb(request)
        span = get_tracer().start_span("scheduler.generate", context=incoming_context(context.invocation_metadata()),
                                       attributes={"req_id": generate.req_id,
                                                   "num_prompt_tokens": len(generate.prompt_token_ids)})
        try:
            queue = engine.add_request(generate, span, traceparent_of(span))
        except BaseException:  # rejected: nothing to abort (the id may belong to another live request)
            span.end()
            raise
        try:
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                if item.finished:
                    span.set_attributes({"finish_reason": item.finish_reason.value,
                                         "num_cached_tokens": item.num_cached_tokens,
                                         "num_output_tokens": item.num_output_tokens})
                yield output_to_chunk(item)
                if item.finished:
                    return
        finally:  # also on cancellation: the client went away, free the blocks now
            engine.abort_request(generate.req_id)
            span.end()

    @map_errors
    async def GetStats(self, request, context) -> scheduler_pb2.SchedulerStats:  # noqa: N802
        return stats_to_pb(self.stats())

    @map_errors
    async def Describe(self, request, context) -> common_pb2.ModelDescription:  # noqa: N802
        return description_to_pb(self._ready().scheduler.worker)

    def stats(self) -> ServiceStats:
        engine = self._ready()
        stats = engine.scheduler.snapshot_stats()
        return ServiceStats(
            num_running=stats.num_running, num_waiting=stats.num_waiting, kv_usage=stats.kv_usage,
            num_steps=stats.num_steps, num_preemptions=stats.num_preemptions,
            num_scheduled_tokens_total=stats.num_scheduled_tokens_total, num_finished=stats.num_finished,
            prefix_cache_queries=stats.prefix_cache_queries, prefix_cache_hits=stats.prefix_cache_hits,
            prefix_cache_evictions=stats.prefix_cache_evictions, num_kv_blocks=engine.scheduler.worker.num_kv_blocks,
            num_state_writes=self.state.num_writes, num_state_writes_dropped=self.state.num_dropped,
            state_store_connected=self.state.connected, num_prefix_deferrals=stats.num_prefix_deferrals)
