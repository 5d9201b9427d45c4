"""The scheduler's asyncio loop: schedule a step, run it on the worker over gRPC, hand outputs to the streams.

Everything that touches the Scheduler runs on the event loop thread, so adds and aborts interleave with steps
without locks: an abort frees the request's blocks at once, and an output of a step that was in flight for an
aborted request is dropped by `update_from_output`. The loop sleeps on an event while there is nothing to do.

A step's outputs update the Scheduler at once but reach the streams' queues only once the next step's call has
started: each woken stream then writes its chunk to the gateway while the worker computes, instead of all of them
running before the call goes out (64 streams held every step's call back by about 10 ms).

A lost worker (a failed or overdue step, a step reply from another worker incarnation, or the WorkerMonitor's
report) fails every live request; the loop then waits for a worker, and a new incarnation or pool gets a fresh
Scheduler (no block state, no prefix cache). Arrivals pass readiness (worker lost, draining) and admission control
(a bounded queue, a predicted wait) before the Scheduler sees them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

import grpc.aio
from opentelemetry import trace

from services.grpc_errors import RequestFailed, ServiceNotReady, WorkerUnavailable
from services.scheduler.admission import AdmissionConfig, AdmissionControl
from services.scheduler.readiness import NotReady, Readiness
from services.scheduler.request_observer import RequestObserver
from services.scheduler.scheduler import RequestRejected, Scheduler, SchedulerOutput
from services.scheduler.worker_client import WorkerClient
from services.scheduler.worker_monitor import same_worker
from shared.request_io import GenerateRequest, RequestOutput
from shared.step_protocol import FailedRequest, ModelDescription, StepInput, StepOutput
from shared.tracing import get_tracer

log = logging.getLogger(__name__)
Item = RequestOutput | Exception  # what a request's queue carries: its outputs, or the error that ended it


class StateWriter(Protocol):
    def request_arrived(self, req_id: str, num_prompt_tokens: int, arrival_time_s: float) -> None: ...
    def request_first_token(self, req_id: str, num_cached_tokens: int) -> None: ...
    def request_finished(self, req_id: str, finish_reason: str, num_output_tokens: int,
                         num_cached_tokens: int) -> None: ...


def request_error(failure: FailedRequest) -> Exception:
    """A worker-reported failure as the error its stream ends with (a 400 for the client's own parameters)."""
    if failure.invalid_argument:
        return RequestRejected(failure.message)
    return RequestFailed(f"the worker failed on the request: {failure.message}")


class EngineLoop:
    def __init__(self, scheduler: Scheduler, worker: WorkerClient, state: StateWriter,
                 observer: RequestObserver | None = None, trace_step_interval: int = 0,
                 readiness: Readiness | None = None, admission: AdmissionControl | None = None) -> None:
        self.scheduler = scheduler
        self.worker = worker
        self.state = state
        self.observer = observer or RequestObserver(None, scheduler.description.model_name)
        self.trace_step_interval = trace_step_interval  # every Nth step gets a span (linked to its requests); 0: none
        self.readiness = readiness or Readiness()
        self.admission = admission or AdmissionControl(AdmissionConfig())
        self.recovering = False  # waiting for the worker to come back (the WorkerMonitor stands aside)
        self.last_step_end_s = time.monotonic()
        self._lost: WorkerUnavailable | None = None  # set when the worker is lost; the loop recovers next
        self._lost_event = asyncio.Event()  # set with _lost: the step in flight is not waited for
        self._queues: dict[str, asyncio.Queue[Item]] = {}  # live requests: req_id -> its stream's queue
        self._span_contexts: dict[str, trace.SpanContext] = {}  # req_id -> its request span, for step links
        self._traceparents: dict[str, str] = {}  # req_id -> W3C traceparent, sent with its first step
        self._wakeup = asyncio.Event()
        self._undelivered: list[tuple[asyncio.Queue[Item], Item]] = []  # the last step's outputs, not yet queued
        self._resumed = True  # the loop waited for work since its last step: the worker's wait is not a round trip
        self.num_steps = 0

    @property
    def ready(self) -> bool:
        return self.readiness.ready

    @property
    def num_live_requests(self) -> int:
        return len(self._queues)

    @property
    def live_req_ids(self) -> set[str]:
        return set(self._queues)

    @property
    def worker_description(self) -> ModelDescription:
        return self.scheduler.description

    def add_request(self, request: GenerateRequest, span: trace.Span | None = None,
                    traceparent: str = "") -> asyncio.Queue[Item]:
        """Queue a request; raises RequestRejected, Overloaded (a full queue, or a predicted wait over the bound), or
        ServiceNotReady while not ready (worker lost, draining)."""
        if not self.readiness.ready:
            raise ServiceNotReady(self.readiness.reason)
        self.admission.check(self.scheduler, request)
        self.scheduler.add_request(request)
        queue: asyncio.Queue[Item] = asyncio.Queue()
        self._queues[request.req_id] = queue
        if span is not None and span.get_span_context().is_valid:
            self._span_contexts[request.req_id] = span.get_span_context()
        if traceparent:
            self._traceparents[request.req_id] = traceparent
        self.state.request_arrived(request.req_id, len(request.prompt_token_ids), request.arrival_time_s)
        self.observer.arrived(request.req_id, len(request.prompt_token_ids), span)
        self._wakeup.set()
        return queue

    def abort_request(self, req_id: str) -> None:
        """Drop a live request now (its stream was cancelled); a no-op once it finished."""
        request = self.scheduler.requests.get(req_id)
        if self._forget(req_id) and self.scheduler.abort_request(req_id):
            self.state.request_finished(req_id, "abort", 0, 0)
            self.observer.finished(req_id, "abort", request.num_prompt_tokens, request.num_output_tokens)
            self._wakeup.set()  # tell the worker to drop its mirror promptly

    def fail_request(self, req_id: str, error: Exception) -> None:
        """End a live request with an error on its stream; its blocks are free at once."""
        queue = self._queues.get(req_id)
        if queue is not None:
            queue.put_nowait(error)
            self._forget(req_id)
            self.observer.forget(req_id)
            if self.scheduler.abort_request(req_id):
                self.state.request_finished(req_id, "error", 0, 0)
            self._wakeup.set()

    def fail_all(self, error: Exception) -> None:
        for req_id in list(self._queues):
            self.fail_request(req_id, error)

    def worker_lost(self, error: WorkerUnavailable) -> None:
        """Stop taking requests; the loop fails the live ones and waits for the worker (once, however often told)."""
        if self._lost is None and not self.recovering:
            self._lost = error
            self.readiness.set(NotReady.WORKER_LOST)
            self._lost_event.set()  # a step in flight is abandoned
            self._wakeup.set()

    def _forget(self, req_id: str) -> bool:
        self._span_contexts.pop(req_id, None)
        self._traceparents.pop(req_id, None)
        return self._queues.pop(req_id, None) is not None

    async def run(self) -> None:
        while True:
            if self._lost is not None:
                await self._recover(self._lost)
            elif self.scheduler.has_unfinished_requests() or self.scheduler.finished_req_ids:
                await self.step()
            else:
                self._deliver()
                self._wakeup.clear()
                self._resumed = True
                await self._wakeup.wait()

    async def step(self) -> None:
        scheduled = self.scheduler.schedule()
        step = scheduled.step_input
        if step.is_empty and not step.finished_req_ids:
            self._deliver()
            self._resumed = True
            await asyncio.sleep(0.005)  # nothing fits right now; let aborts and arrivals run
            return
        self.num_steps += 1
        back_to_back, self._resumed = not self._resumed, False
        self.observer.step_planned(scheduled, self.num_steps)
        traceparents = {r.req_id: self._traceparents[r.req_id] for r in step.new_requests
                        if r.req_id in self._traceparents}
        start_s = time.perf_counter()
        if self.trace_step_interval and self.num_steps % self.trace_step_interval == 0:
            with self._step_span(step):  # the worker's step span joins it through the call's metadata
                output = await self._call_worker(step, traceparents)
        else:
            output = await self._call_worker(step, traceparents)
        duration_s = time.perf_counter() - start_s
        if isinstance(output, WorkerUnavailable):  # (_call_worker delivered the last step's outputs before it)
            self.worker_lost(output)
        elif self._lost is not None:
            pass  # the worker was found lost while this step ran: its output is not trusted
        elif output.incarnation_id != step.incarnation_id:  # it applied nothing: our block ids are not its own
            self.worker_lost(WorkerUnavailable("the worker restarted; requests in flight were lost"))
        else:
            self.scheduler.counters.record_worker_times(output.forward_time_ns, output.sample_time_ns,
                                                     output.idle_time_ns if back_to_back else 0)
            self.admission.estimator.record_step(duration_s, self._dispatch(scheduled, output))

    def _step_span(self, step: StepInput):
        """A sampled step's own trace, linked to the request spans it serves (a step belongs to no one request)."""
        links = [trace.Link(self._span_contexts[r]) for r in step.num_scheduled_tokens if r in self._span_contexts]
        return get_tracer().start_as_current_span(
            "scheduler.step", context=trace.set_span_in_context(trace.INVALID_SPAN), links=links,
            attributes={"step_id": self.num_steps, "num_requests": len(step.num_scheduled_tokens),
                        "num_scheduled_tokens": step.total_num_scheduled_tokens})

    async def _call_worker(self, step: StepInput, traceparents: dict[str, str]) -> StepOutput | WorkerUnavailable:
        """The step on the worker; the last step's outputs go to their streams once the call is out. The call is
        given up when it fails, passes its deadline (--step-progress-timeout-s) or the worker is found lost."""
        call = asyncio.ensure_future(self.worker.step(step, self.num_steps, traceparents))
        lost = asyncio.ensure_future(self._lost_event.wait())
        try:
            await asyncio.sleep(0)  # the call's task runs (and starts the RPC) before any stream it would wake
            self._deliver()
            await asyncio.wait({call, lost}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                return self._lost or WorkerUnavailable("the worker was lost during the step")
            return call.result()
        except grpc.aio.AioRpcError as exc:
            return WorkerUnavailable(f"worker step failed: {exc.code().name}: {exc.details()}")
        finally:
            self.last_step_end_s = time.monotonic()
            lost.cancel()
            call.cancel()  # a no-op once done; else the call is abandoned (lost worker) or this loop is cancelled

    def _deliver(self) -> None:
        for queue, item in self._undelivered:
            queue.put_nowait(item)
        self._undelivered.clear()

    def _dispatch(self, scheduled: SchedulerOutput, output: StepOutput) -> int:
        """Hand the step's outputs to their streams; returns how many requests finished."""
        outputs = self.scheduler.update_from_output(scheduled, output)
        for out in outputs:
            queue = self._queues.get(out.req_id)
            if queue is None:
                continue
            if out.error is not None:
                self._undelivered.append((queue, request_error(out.error)))
                self._forget(out.req_id)
                self.state.request_finished(out.req_id, "error", out.num_output_tokens, out.num_cached_tokens)
                self.observer.finished(out.req_id, "error", out.num_prompt_tokens, out.num_output_tokens)
                continue
            self._undelivered.append((queue, out))
            self.observer.produced(out)
            if out.num_output_tokens == len(out.new_token_ids):
                self.state.request_first_token(out.req_id, out.num_cached_tokens)
            if out.finished:
                self._forget(out.req_id)
                self.state.request_finished(out.req_id, out.finish_reason.value, out.num_output_tokens,
                                            out.num_cached_tokens)
                self.observer.finished(out.req_id, out.finish_reason.value, out.num_prompt_tokens,
                                       out.num_output_tokens)
        return sum(1 for out in outputs if out.finished)

    async def _recover(self, error: WorkerUnavailable) -> None:
        """Fail every live request, wait for the worker, and start over with a fresh scheduler."""
        log.error("%s; failing %d requests and waiting for the worker", error, len(self._queues))
        self.recovering, self._lost = True, None
        self._lost_event.clear()
        self._deliver()  # the last step's outputs reach their streams before the error does
        self.fail_all(error)
        old = self.scheduler.description
        description = await self.worker.wait_until_ready()
        # a restarted worker has an empty KV pool: the old prefix index would serve garbage, old block ids may lie
        # past its pool. The same incarnation still holds the mirrors of the requests just failed: drop them.
        lost_mirrors = self.scheduler.finished_req_ids if same_worker(old, description) else []
        self.scheduler = Scheduler(self.scheduler.config, description)
        self.scheduler.finished_req_ids = lost_mirrors
        self.recovering = False
        self.readiness.set(NotReady.WORKER_NOT_SERVING, False)
        self.readiness.set(NotReady.WORKER_LOST, False)
        log.info("worker at %s is back (incarnation %s, %d KV blocks of %d tokens)", self.worker.address,
                 description.incarnation_id, description.num_kv_blocks, description.block_size)
