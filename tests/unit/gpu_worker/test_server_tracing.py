"""The worker's spans: a new request's span joins the request's trace; a step gets a span only when the scheduler
traces that step (no trace of its own per step); health "" is liveness, the named service readiness."""

from __future__ import annotations

import pytest
from grpc_health.v1 import health_pb2
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pagedserve.services.gpu_worker import server
from pagedserve.services.gpu_worker.server import SERVICE_NAME, WorkerServicer, build_server, set_serving
from pagedserve.services.proto_convert.worker_contract import step_input_to_pb
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import NewRequest, StepInput, StepOutput
from pagedserve.shared.tracing import traceparent_of
from tests.unit.gpu_worker.launched_step import DoneStep


class FakeWorker:
    def launch_step(self, step: StepInput) -> DoneStep:
        return DoneStep(self.execute_step(step))

    def execute_step(self, step: StepInput) -> StepOutput:
        return StepOutput(req_ids=["r"], sampled_token_ids=[7], logprobs=[None])


class FakeContext:
    def __init__(self, metadata=()) -> None:
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


@pytest.fixture
def traced(monkeypatch):
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(server, "get_tracer", lambda: provider.get_tracer("test"))
    servicer = WorkerServicer()
    servicer.worker = FakeWorker()
    yield servicer, provider.get_tracer("test"), exporter


def step_pb(traceparent: str):
    step = StepInput(new_requests=[NewRequest("r", [1, 2], 2, SamplingParams(), [0], 0)],
                     num_scheduled_tokens={"r": 2})
    return step_input_to_pb(step, step_id=3, traceparents={"r": traceparent})


def test_untraced_steps_make_no_trace_but_requests_join_theirs(traced):
    servicer, tracer, exporter = traced
    request_span = tracer.start_span("scheduler.generate")
    servicer.Step(step_pb(traceparent_of(request_span)), FakeContext())
    (span,) = exporter.get_finished_spans()  # no worker.step span: it would be a trace of its own
    assert span.name == "worker.new_request" and span.parent.span_id == request_span.get_span_context().span_id
    assert span.context.trace_id == request_span.get_span_context().trace_id and not span.links


def test_a_traced_step_gets_a_child_span_linked_from_its_requests(traced):
    servicer, tracer, exporter = traced
    request_span, step_span = tracer.start_span("scheduler.generate"), tracer.start_span("scheduler.step")
    metadata = [("traceparent", traceparent_of(step_span))]
    servicer.Step(step_pb(traceparent_of(request_span)), FakeContext(metadata))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["worker.step"].parent.span_id == step_span.get_span_context().span_id
    assert spans["worker.step"].attributes["step_id"] == 3
    assert [link.context.span_id for link in spans["worker.new_request"].links] == \
        [spans["worker.step"].context.span_id]


def test_health_liveness_is_serving_before_the_model_is_loaded():
    grpc_server, health = build_server(WorkerServicer(), "127.0.0.1", 0)
    try:
        def status(service: str):
            return health.Check(health_pb2.HealthCheckRequest(service=service), None).status

        assert status("") == health_pb2.HealthCheckResponse.SERVING
        assert status(SERVICE_NAME) == health_pb2.HealthCheckResponse.NOT_SERVING
        set_serving(health, True)
        assert status(SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
        set_serving(health, False)  # stopping: not ready, still alive
        assert (status(""), status(SERVICE_NAME)) == (health_pb2.HealthCheckResponse.SERVING,
                                                      health_pb2.HealthCheckResponse.NOT_SERVING)
    finally:
        grpc_server.stop(0)
