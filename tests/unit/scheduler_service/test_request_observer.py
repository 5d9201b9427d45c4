"""A request's life as span events and latency histograms; engine-step spans only when sampled, never per request."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pagedserve.services.proto_convert.scheduler_contract import generate_request_to_pb
from pagedserve.services.scheduler import engine_loop, service
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.request_observer import RequestObserver
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.service import SchedulerServicer
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient
from tests.unit.scheduler_service.test_service import Aborted, FakeContext

SMALL_POOL = DESCRIPTION.__class__(**{**DESCRIPTION.__dict__, "num_kv_blocks": 4})  # 16 tokens: forces preemption


@pytest.fixture
def spans(monkeypatch):
    """Spans the scheduler's code starts go to an in-memory exporter (no global provider is touched)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for module in (engine_loop, service):
        monkeypatch.setattr(module, "get_tracer", lambda: provider.get_tracer("test"))
    yield provider, exporter


@contextlib.asynccontextmanager
async def running(engine: EngineLoop):
    task = asyncio.create_task(engine.run())
    try:
        yield engine
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def finish(queue: asyncio.Queue) -> None:
    while not (await asyncio.wait_for(queue.get(), 5)).finished:
        pass


def events(span) -> list[tuple[str, dict]]:
    return [(e.name, dict(e.attributes)) for e in span.events]


@pytest.mark.asyncio
async def test_events_follow_chunks_preemption_and_the_end(spans):
    provider, exporter = spans
    metrics = SchedulerMetrics(lambda: None)
    engine = EngineLoop(Scheduler(SchedulerConfig(max_num_batched_tokens=4, prefill_finish_slack=0), SMALL_POOL),
                        FakeWorkerClient(), NullStateWriter(), RequestObserver(metrics, "fake"))
    tracer = provider.get_tracer("test")
    request_spans = {name: tracer.start_span(name) for name in ("a", "b")}
    async with running(engine):
        queues = [engine.add_request(GenerateRequest(name, list(range(first, first + 6)), SamplingParams(max_tokens=8)),
                                     request_spans[name]) for name, first in (("a", 10), ("b", 20))]
        await asyncio.gather(*(finish(q) for q in queues))
    a, b = (events(request_spans[name]) for name in ("a", "b"))
    assert a[:4] == [("queued", {"num_prompt_tokens": 6}),
                     ("scheduled", {"step_id": 1, "num_cached_tokens": 0, "resumed": False}),
                     ("prefill_chunk", {"step_id": 1, "num_tokens": 4}),
                     ("prefill_chunk", {"step_id": 2, "num_tokens": 2})]
    assert [name for name, _ in a[4:]] == ["first_token", "finished"]
    assert a[-1][1] == {"finish_reason": "length", "num_output_tokens": 8}
    names = [name for name, _ in b]
    preempted = names.index("preempted")  # the pool holds one request's 14 tokens, not two
    assert names[preempted + 1] == "scheduled" and b[preempted + 1][1]["resumed"] is True
    assert names[preempted + 2] == "prefill_chunk" and names[-1] == "finished"
    assert b[preempted + 2][1]["num_tokens"] == 4  # the recompute of its prompt and outputs, chunked again
    assert engine.observer.requests == {}

    def count(name: str) -> float:
        return metrics.registry.get_sample_value(f"{name}_count", {"model_name": "fake"})

    assert count("pagedserve_time_to_first_token_seconds") == 2
    assert count("pagedserve_inter_token_latency_seconds") == 2 * 7
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time",
                 "request_inference_time"):
        assert count(f"pagedserve_{name}_seconds") == 2, name
    assert count("pagedserve_iteration_tokens") == engine.num_steps
    assert metrics.registry.get_sample_value("pagedserve_request_generation_tokens_sum", {"model_name": "fake"}) == 16


@pytest.mark.asyncio
async def test_engine_steps_get_linked_root_spans_only_when_sampled(spans):
    provider, exporter = spans
    engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), NullStateWriter(),
                        trace_step_interval=2)
    request_span = provider.get_tracer("test").start_span("request")
    async with running(engine):
        await finish(engine.add_request(GenerateRequest("r", [10, 11, 12], SamplingParams(max_tokens=5)),
                                        request_span))
    request_span.end()
    steps = [s for s in exporter.get_finished_spans() if s.name == "scheduler.step"]
    # 5 steps compute the request, a 6th only drops its mirror on the worker: every second one is traced
    assert [(s.attributes["step_id"], s.attributes["num_requests"]) for s in steps] == [(2, 1), (4, 1), (6, 0)]
    for step in steps:
        assert step.parent is None and step.context.trace_id != request_span.get_span_context().trace_id
    for step in steps[:2]:
        assert [link.context.span_id for link in step.links] == [request_span.get_span_context().span_id]


@pytest.mark.asyncio
async def test_a_failed_request_marks_its_span_as_an_error(spans):
    _, exporter = spans
    servicer = SchedulerServicer()
    worker = FakeWorkerClient(step_delay_s=0.01)
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), worker, servicer.state)
    async with running(servicer.engine):
        worker.fail_next_step = True  # the worker is lost during the request's first step
        with pytest.raises(Aborted):
            async for _ in servicer.Generate(generate_request_to_pb(GenerateRequest("lost", [5, 6], SamplingParams())),
                                             FakeContext()):
                pass
        with pytest.raises(Aborted):  # rejected at once: longer than the context
            async for _ in servicer.Generate(generate_request_to_pb(GenerateRequest("long", [5] * 300,
                                                                                    SamplingParams())),
                                             FakeContext()):
                pass
    spans_by_id = {s.attributes["req_id"]: s for s in exporter.get_finished_spans() if s.name == "scheduler.generate"}
    for req_id, error in (("lost", "WorkerUnavailable"), ("long", "RequestRejected")):
        span = spans_by_id[req_id]
        assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == error
        assert any(e.name == "exception" for e in span.events)
    assert spans_by_id["lost"].attributes["gen_ai.request.model"] == "fake"


@pytest.mark.asyncio
async def test_the_request_span_carries_its_priority_and_tenant(spans):
    _, exporter = spans
    servicer = SchedulerServicer()
    servicer.engine = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), FakeWorkerClient(), servicer.state)
    async with running(servicer.engine):
        for request in (GenerateRequest("urgent", [5, 6], SamplingParams(max_tokens=2), priority=-2, tenant="team-a"),
                        GenerateRequest("plain", [5, 6], SamplingParams(max_tokens=2))):
            async for _ in servicer.Generate(generate_request_to_pb(request), FakeContext()):
                pass
    spans_by_id = {s.attributes["req_id"]: s for s in exporter.get_finished_spans() if s.name == "scheduler.generate"}
    assert (spans_by_id["urgent"].attributes["priority"], spans_by_id["urgent"].attributes["tenant"]) == (-2, "team-a")
    assert (spans_by_id["plain"].attributes["priority"], spans_by_id["plain"].attributes["tenant"]) == (0, "")
