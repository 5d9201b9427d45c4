"""The gpu-worker's gRPC server: Describe, Steps (the scheduler's stream of steps) and Step around one Worker.
Health: "" (liveness) SERVING while the process serves gRPC; pagedserve.v1.WorkerService (readiness) SERVING once
the model is loaded.

The model is built and every step runs on one dedicated thread. gRPC hands calls to a pool of threads, and each
thread that enters torch's OpenMP regions gets its own team of worker threads, which spin after each region: steps
hopping between pool threads left several teams competing for the cores (single-stream steps took ~1.8x longer).

One process per device. Steps are serialised (one forward at a time); health and Describe answer meanwhile. On the
Steps stream a reader thread hands each step to the model thread as it arrives, so the next step is queued while
one runs (async scheduling), and the replies go back in order. When the next step is already queued as one is
launched, its reply is completed only after that next step is launched too: the sampled ids reach the host while
the device runs on (model_runner.py), instead of the device idling through the host's turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace

from pagedserve.services.grpc_errors import ServiceNotReady, map_errors
from pagedserve.services.internal_auth import TokenInterceptor
from pagedserve.services.ports import GRPC_SERVER_OPTIONS, bind_grpc_port
from pagedserve.services.proto_convert.common import description_to_pb, structured_output_from_pb
from pagedserve.services.proto_convert.worker_contract import (
    step_input_from_pb,
    step_output_to_pb,
    traceparents_from_pb,
)
from pagedserve.services.proto_gen import common_pb2, worker_pb2, worker_pb2_grpc
from pagedserve.shared.step_protocol import StepInput
from pagedserve.shared.tracing import context_from_traceparent, get_tracer, incoming_context

if TYPE_CHECKING:  # the worker imports torch: the server binds its port (and answers health) first
    from pagedserve.services.gpu_worker.worker import PendingStep, Worker
    from pagedserve.services.gpu_worker.worker_config import WorkerConfig

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
        self._num_queued = 0  # steps submitted to the model thread and not launched yet
        self._deferred: tuple[PendingStep, futures.Future, int] | None = None  # launched, reply not completed

    def idle_for_s(self) -> float:
        """Seconds since the last step ended; 0 while one runs (a draining worker waits for its scheduler)."""
        with self._lock:
            return 0.0 if self.num_steps_in_flight else time.monotonic() - self.last_step_end_s

    def load(self, config: WorkerConfig) -> None:
        """Build the Worker on the model thread, where its steps will run too."""
        from pagedserve.services.gpu_worker.parallel.launch import build_worker

        self.worker = self._model_thread.submit(build_worker, config).result()

    def _ready(self) -> Worker:
        if self.worker is None:
            raise ServiceNotReady("the worker is still loading the model")
        return self.worker

    @map_errors
    def Describe(self, request, context) -> common_pb2.ModelDescription:  # noqa: N802 - gRPC method name
        return description_to_pb(self._ready().describe())

    @map_errors
    def Step(self, request: worker_pb2.StepRequest, context) -> worker_pb2.StepReply:  # noqa: N802
        parent = incoming_context(context.invocation_metadata())
        return step_output_to_pb(self._submit(self._ready(), request, parent).result())

    @map_errors
    def Steps(self, request_iterator: Iterator[worker_pb2.StepRequest], context  # noqa: N802
              ) -> Iterator[worker_pb2.StepReply]:
        """Reply to each step in order; a step that fails ends the stream, and the steps queued after it are
        dropped."""
        worker = self._ready()
        submitted: queue.SimpleQueue[futures.Future | None] = queue.SimpleQueue()
        threading.Thread(target=self._queue_steps, args=(worker, request_iterator, submitted), daemon=True,
                         name="steps-reader").start()
        try:
            while (future := submitted.get()) is not None:
                yield step_output_to_pb(future.result())
        finally:  # the stream failed or was cancelled: steps not started yet are not run
            while not submitted.empty():
                if (future := submitted.get_nowait()) is not None:
                    future.cancel()

    def _queue_steps(self, worker: Worker, requests: Iterator[worker_pb2.StepRequest],
                     submitted: queue.SimpleQueue[futures.Future | None]) -> None:
        """The stream's reader: each step goes to the model thread as soon as it arrives."""
        try:
            for request in requests:
                parent = context_from_traceparent(request.traceparent) if request.traceparent else None
                submitted.put(self._submit(worker, request, parent))
        except grpc.RpcError:  # the scheduler went away: the stream is over
            pass
        finally:
            submitted.put(None)

    def _submit(self, worker: Worker, request: worker_pb2.StepRequest, parent) -> futures.Future:
        """Queue the step on the model thread (one step at a time); spans end when it does."""
        step = step_input_from_pb(request)
        step_span = None
        if parent is not None and trace.get_current_span(parent).get_span_context().is_valid:  # a traced step
            step_span = get_tracer().start_span("worker.step", context=parent,
                                                attributes=_step_attributes(request.step_id, step))
        # without a step span the requests' own spans still join their traces
        request_spans = _start_request_spans(traceparents_from_pb(request), step, step_span)
        with self._lock:
            self.num_steps_in_flight += 1
            self._num_queued += 1
        future: futures.Future = futures.Future()
        self._model_thread.submit(self._execute, worker, step, future)
        future.add_done_callback(self._step_ended)
        if step_span is not None or request_spans:
            future.add_done_callback(lambda done: _end_step_spans(done, step_span, request_spans))
        return future

    def _step_ended(self, done: futures.Future) -> None:
        with self._lock:
            self.num_steps_in_flight -= 1
            self.last_step_end_s = time.monotonic()

    def _execute(self, worker: Worker, step: StepInput, reply: futures.Future) -> None:
        """On the model thread: launch the step, then complete the reply of the step launched before it; this
        step's own reply waits for the next launch when one is already queued."""
        with self._lock:
            self._num_queued -= 1
            more_queued = self._num_queued > 0
        if not reply.set_running_or_notify_cancel():  # the stream ended before the step started
            self._complete_deferred()
            return
        start_ns = time.perf_counter_ns()
        try:
            pending = worker.launch_step(step)
        except BaseException as exc:
            self._complete_deferred()
            reply.set_exception(exc)
            return
        self._complete_deferred()
        idle_ns = start_ns - self._last_step_end_ns if self._last_step_end_ns else 0
        self._last_step_end_ns = time.perf_counter_ns()
        if more_queued and not pending.ready:  # its ids are still on the device (CUDA): read them after the next
            self._deferred = (pending, reply, idle_ns)
        else:
            _complete(pending, reply, idle_ns)

    def _complete_deferred(self) -> None:
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            _complete(*deferred)

    @map_errors
    def PrepareGrammar(self, request: worker_pb2.PrepareGrammarRequest, context  # noqa: N802
                       ) -> worker_pb2.PrepareGrammarReply:
        """Runs on a gRPC thread (the compile on the grammar pool), beside steps on the model thread."""
        worker = self._ready()
        start_ns = time.perf_counter_ns()
        worker.prepare_grammar(structured_output_from_pb(request.structured_output))
        return worker_pb2.PrepareGrammarReply(compile_time_ns=time.perf_counter_ns() - start_ns)


def _complete(pending: PendingStep, reply: futures.Future, idle_ns: int) -> None:
    """Take a launched step's output (waiting for its ids on the host) and complete its reply."""
    try:
        output = pending.result()
    except BaseException as exc:
        reply.set_exception(exc)
        return
    output.idle_time_ns = idle_ns
    reply.set_result(output)


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


def _end_step_spans(done: futures.Future, step_span: trace.Span | None, request_spans: dict[str, trace.Span]) -> None:
    output = None if done.cancelled() or done.exception() is not None else done.result()
    sampled = set(output.req_ids) if output is not None else set()
    for req_id, span in request_spans.items():
        span.set_attribute("sampled", req_id in sampled)
        span.end()
    if step_span is not None:
        if output is not None:
            step_span.set_attribute("forward_time_ns", output.forward_time_ns)
        step_span.end()


def build_server(servicer: WorkerServicer, host: str, port: int, internal_token: str = "",
                 credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, health.HealthServicer]:
    """The worker's gRPC server on host:port (TLS with `credentials`, else plaintext) and its health servicer."""
    # threads for the Steps stream, two grammar compiles (PrepareGrammar waits on them), probes and the rest
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=[TokenInterceptor(internal_token)],
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *GRPC_SERVER_OPTIONS])
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)  # liveness: the process serves gRPC
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)  # readiness: the model is loaded
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bind_grpc_port(server, host, port, "the worker's gRPC server", "--worker-port", credentials)
    return server, health_servicer


def health_only_server(health_servicer: health.HealthServicer, host: str, port: int) -> grpc.Server:
    """A plaintext server of gRPC health alone on `port` (--worker-health-port): probes that cannot speak TLS see
    the same liveness and readiness as the TLS gRPC port, and nothing else."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=GRPC_SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bind_grpc_port(server, host, port, "the worker's health server", "--worker-health-port")
    return server


def set_serving(health_servicer: health.HealthServicer, serving: bool) -> None:
    """Readiness (the named service); liveness ("") stays SERVING while the process runs."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    health_servicer.set(SERVICE_NAME, status)
