"""The gpu-worker's gRPC server: Describe and Step around one Worker. Health: "" (liveness) SERVING while the
process serves gRPC; pagedserve.v1.WorkerService (readiness) SERVING once the model is loaded.

The model is built and every step runs on one dedicated thread. gRPC hands calls to a pool of threads, and each
thread that enters torch's OpenMP regions gets its own team of worker threads, which spin after each region: steps
hopping between pool threads left several teams competing for the cores (single-stream steps took ~1.8x longer).

One process per device. Steps are serialised (one forward at a time); health and Describe answer meanwhile.
Health: "" is liveness (SERVING while the process runs), "pagedserve.v1.WorkerService" readiness (model loaded).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace

from services.grpc_errors import ServiceNotReady, map_errors
from services.internal_auth import TokenInterceptor
from services.ports import GRPC_SERVER_OPTIONS, bind_grpc_port
from services.proto_convert.common import description_to_pb
from services.proto_convert.worker_contract import step_input_from_pb, step_output_to_pb, traceparents_from_pb
from services.proto_gen import common_pb2, worker_pb2, worker_pb2_grpc
from shared.step_protocol import StepInput, StepOutput
from shared.tracing import context_from_traceparent, get_tracer, incoming_context

if TYPE_CHECKING:  # the worker imports torch: the server binds its port (and answers health) first
    from services.gpu_worker.worker import Worker
    from services.gpu_worker.worker_config import WorkerConfig

log = logging.getLogger(__name__)
SERVICE_NAME = "pagedserve.v1.WorkerService"
MAX_MESSAGE_BYTES = 64 * 1024**2


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self) -> None:
        self.worker: Worker | None = None  # set once the model is loaded
        self._model_thread = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self._last_step_end_ns = 0  # when the model thread finished its last step (0: none yet)
        self._lock = threading.Lock()
        self.num_steps_in_flight = 0
        self.last_step_end_s = time.monotonic()

    def idle_for_s(self) -> float:
        """Seconds since the last step ended; 0 while one runs (a draining worker waits for its scheduler)."""
        with self._lock:
            return 0.0 if self.num_steps_in_flight else time.monotonic() - self.last_step_end_s

    def load(self, config: WorkerConfig) -> None:
        """Build the Worker on the model thread, where its steps will run too."""
        from services.gpu_worker.worker import Worker

        self.worker = self._model_thread.submit(Worker, config).result()

    def _ready(self) -> Worker:
        if self.worker is None:
            raise ServiceNotReady("the worker is still loading the model")
        return self.worker

    @map_errors
    def Describe(self, request, context) -> common_pb2.ModelDescription:  # noqa: N802 - gRPC method name
        return description_to_pb(self._ready().describe())

    @map_errors
    def Step(self, request: worker_pb2.StepRequest, context) -> worker_pb2.StepReply:  # noqa: N802
        with self._lock:
            self.num_steps_in_flight += 1
        try:
            return self._step(request, context)
        finally:
            with self._lock:
                self.num_steps_in_flight -= 1
                self.last_step_end_s = time.monotonic()

    def _step(self, request: worker_pb2.StepRequest, context) -> worker_pb2.StepReply:
        worker = self._ready()
        step = step_input_from_pb(request)
        parent = incoming_context(context.invocation_metadata())
        if trace.get_current_span(parent).get_span_context().is_valid:  # a step the scheduler traces
            with get_tracer().start_as_current_span("worker.step", context=parent,
                                                    attributes=_step_attributes(request.step_id, step)) as span:
                output = self._run_step(worker, step, traceparents_from_pb(request), span)
                span.set_attribute("forward_time_ns", output.forward_time_ns)
        else:  # no trace of its own per step: the requests' spans below still join their traces
            output = self._run_step(worker, step, traceparents_from_pb(request), None)
        return step_output_to_pb(output)

    def _run_step(self, worker: Worker, step: StepInput, traceparents: dict[str, str],
                  step_span: trace.Span | None) -> StepOutput:
        request_spans = _start_request_spans(traceparents, step, step_span)
        output = self._model_thread.submit(self._execute, worker, step).result()  # one step at a time
        _end_request_spans(request_spans, output)
        return output

    def _execute(self, worker: Worker, step: StepInput) -> StepOutput:
        """On the model thread: run the step and say how long the thread waited for it since its last one."""
        start_ns = time.perf_counter_ns()
        output = worker.execute_step(step)
        output.idle_time_ns = start_ns - self._last_step_end_ns if self._last_step_end_ns else 0
        self._last_step_end_ns = time.perf_counter_ns()
        return output


def _step_attributes(step_id: int, step: StepInput) -> dict:
    return {"step_id": step_id, "num_new_requests": len(step.new_requests),
            "num_cached_requests": len(step.cached_requests),
            "num_scheduled_tokens": step.total_num_scheduled_tokens}


def _start_request_spans(traceparents: dict[str, str], step: StepInput, step_span: trace.Span | None
                         ) -> dict[str, trace.Span]:
    """A span in each new request's own trace (a child of its scheduler span), linked to the step's span if any."""
    if not traceparents:
        return {}
    tracer = get_tracer()
    links = [trace.Link(step_span.get_span_context())] if step_span is not None and step_span.is_recording() else []
    spans = {}
    for new in step.new_requests:
        if new.req_id in traceparents:
            spans[new.req_id] = tracer.start_span(
                "worker.new_request", context=context_from_traceparent(traceparents[new.req_id]), links=links,
                attributes={"req_id": new.req_id, "num_prompt_tokens": new.num_prompt_tokens,
                            "num_computed_tokens": new.num_computed_tokens,
                            "num_scheduled_tokens": step.num_scheduled_tokens.get(new.req_id, 0)})
    return spans


def _end_request_spans(spans: dict[str, trace.Span], output: StepOutput) -> None:
    sampled = dict(zip(output.req_ids, output.sampled_token_ids, strict=True))
    for req_id, span in spans.items():
        span.set_attribute("sampled", req_id in sampled)
        span.end()


def build_server(servicer: WorkerServicer, host: str, port: int, internal_token: str = ""
                 ) -> tuple[grpc.Server, health.HealthServicer]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[TokenInterceptor(internal_token)],
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *GRPC_SERVER_OPTIONS])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)  # liveness: the process serves gRPC
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)  # readiness: the model is loaded
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bind_grpc_port(server, host, port, "the worker's gRPC server", "--worker-port")
    return server, health_servicer


def set_serving(health_servicer: health.HealthServicer, serving: bool) -> None:
    """Readiness (the named service); liveness ("") stays SERVING while the process runs."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    health_servicer.set(SERVICE_NAME, status)
