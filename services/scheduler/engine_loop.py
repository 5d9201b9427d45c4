"""The scheduler's asyncio loop: schedule a step, run it on the worker over gRPC, hand outputs to the streams.

Everything that touches the Scheduler runs on the event loop thread, so adds and aborts interleave with steps
without locks: an abort frees the request's blocks at once, and an output of a step that was in flight for an
aborted request is dropped by `update_from_output`. The loop sleeps on an event while there is nothing to do.

Async scheduling (the default): step N+1 is planned and sent on the worker's Steps stream while the worker runs step
N, which it queues, so the worker never waits for a round trip or for the scheduler; at most two steps are in flight.
The Scheduler plans N+1 before N's output is back (it holds a placeholder for each token N samples, which the worker
feeds into N+1 from its mirror), and N's outputs apply only to the requests still live, so stops, aborts and
preemptions stay exact. With async scheduling off one step is in flight at a time (the same outputs).

Late planning (with async scheduling, while requests arrive): N+1 is planned shortly before N is expected to end
(N's start plus the recent step time, less a lead for planning and the trip to the worker) rather than as N starts,
so that a request arriving during N joins N+1 instead of N+2: a step less of TTFT under load. Should N end sooner,
N+1 goes out as its reply comes back, as with async scheduling off for that step.

A step's outputs update the Scheduler at once but reach the streams' queues only once the next step is sent: each
woken stream then writes its chunk to the gateway while the worker computes, instead of all of them running before
the step goes out (64 streams held every step back by about 10 ms).

A lost worker (a failed or overdue step, a step reply from another worker incarnation, or the WorkerMonitor's
report) fails every live request; the loop then waits for a worker, and a new incarnation or pool gets a fresh
Scheduler (no block state, no prefix cache). Arrivals pass readiness (worker lost, draining) and admission control
(a bounded queue, a predicted wait) before the Scheduler sees them.

Parts: live requests (one record each, services/scheduler/live_request.py), steps in flight (in_flight.py), output
fan-out (output_dispatch.py), step traces (step_tracing.py), grammar compiles (grammar_preparation.py). Invariants,
checked where they can break (they hold under `python -O`): at most `max_in_flight` steps out; a request is live
at most once; between steps the live requests are exactly the Scheduler's, each in one state and no block held
by a finished one (the full check runs whenever the loop idles with --check-integrity-when-idle).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc.aio
from opentelemetry import trace

from pagedserve.services.grpc_errors import ServiceNotReady, WorkerUnavailable
from pagedserve.services.scheduler.admission import AdmissionConfig, AdmissionControl
from pagedserve.services.scheduler.grammar_preparation import GrammarPreparer
from pagedserve.services.scheduler.in_flight import InFlight, StepsInFlight
from pagedserve.services.scheduler.integrity import require_integrity
from pagedserve.services.scheduler.live_request import Item, LiveRequest, LiveRequests
from pagedserve.services.scheduler.output_dispatch import OutputDispatcher, StateWriter
from pagedserve.services.scheduler.readiness import NotReady, Readiness
from pagedserve.services.scheduler.request_observer import RequestObserver
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.step_tracing import StepTracer
from pagedserve.services.scheduler.worker_client import WorkerClient
from pagedserve.services.scheduler.worker_monitor import same_worker
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.step_protocol import ModelDescription
from pagedserve.shared.tracing import get_tracer, traceparent_of

log = logging.getLogger(__name__)

ARRIVALS_WINDOW_S = 1.0  # steps are planned late while a request arrived this recently
PLAN_LEAD_FRACTION = 0.25  # a late plan goes out this share of a step before the running one is expected to end
MIN_PLAN_LEAD_S = 0.003


class EngineLoop:
    def __init__(self, scheduler: Scheduler, worker: WorkerClient, state: StateWriter,
                 observer: RequestObserver | None = None, trace_step_interval: int = 0,
                 readiness: Readiness | None = None, admission: AdmissionControl | None = None,
                 async_scheduling: bool = False, late_planning: bool = False,
                 check_integrity_when_idle: bool = False) -> None:
        self.scheduler = scheduler
        self.worker = worker
        self.observer = observer or RequestObserver(None, scheduler.description.model_name)
        self.readiness = readiness or Readiness()
        self.admission = admission or AdmissionControl(AdmissionConfig())
        self.recovering = False  # waiting for the worker to come back (the WorkerMonitor stands aside)
        self.last_step_end_s = time.monotonic()
        self._lost: WorkerUnavailable | None = None  # set when the worker is lost; the loop recovers next
        self._lost_signal: asyncio.Future[None] | None = None  # done with _lost: the step in flight is not waited for
        self.grammars = GrammarPreparer(worker)
        self._live = LiveRequests()
        self.outputs = OutputDispatcher(self._live, state, self.observer)
        self.tracer = StepTracer(self._live, trace_step_interval, get_tracer)
        self._wakeup = asyncio.Event()
        self._resumed = True  # the loop waited for work since its last step: the worker's wait is not a round trip
        # async scheduling: the next step is sent while one runs (the worker queues it); serial: one at a time
        self._in_flight = StepsInFlight(2 if async_scheduling else 1)
        self.late_planning = late_planning and async_scheduling  # see _plan_late
        self._last_arrival_s = -ARRIVALS_WINDOW_S  # time.perf_counter() of the last arrival, admitted or not
        self.check_integrity_when_idle = check_integrity_when_idle  # debug: the full leak check at every idle
        self.num_steps = 0

    @property
    def state(self) -> StateWriter:
        return self.outputs.state

    @state.setter
    def state(self, state: StateWriter) -> None:
        self.outputs.state = state

    @property
    def max_in_flight(self) -> int:
        return self._in_flight.max_in_flight

    @property
    def ready(self) -> bool:
        return self.readiness.ready

    @property
    def num_live_requests(self) -> int:
        return len(self._live)

    @property
    def live_req_ids(self) -> set[str]:
        return self._live.ids()

    @property
    def worker_description(self) -> ModelDescription:
        return self.scheduler.description

    def add_request(self, request: GenerateRequest, span: trace.Span | None = None,
                    traceparent: str = "") -> asyncio.Queue[Item]:
        """Queue a request; raises RequestRejected, Overloaded (a full queue, or a predicted wait over the bound), or
        ServiceNotReady while not ready (worker lost, draining)."""
        if not self.readiness.ready:
            raise ServiceNotReady(self.readiness.reason)
        self._last_arrival_s = time.perf_counter()
        ends_in_s = self._in_flight.oldest_ends_in_s(self.admission.estimator)
        self.admission.check(self.scheduler, request, len(self._in_flight), ends_in_s,
                             self._in_flight.all_back_in_s(self.admission.estimator, ends_in_s))
        self.scheduler.add_request(request)
        span_context = span.get_span_context() if span is not None else None
        live = LiveRequest(request.req_id, asyncio.Queue(), span_context if span_context and span_context.is_valid
                           else None, traceparent)
        self._live.add(live)
        self.state.request_arrived(request.req_id, len(request.prompt_token_ids), request.arrival_time_s)
        self.observer.arrived(request.req_id, len(request.prompt_token_ids), span)
        if request.sampling.structured_output is not None:
            self.grammars.prepare_for(request.req_id, request.sampling.structured_output, self._grammar_compiled,
                                      self.fail_request)
        self._wakeup.set()
        return live.queue

    def _grammar_compiled(self, req_id: str) -> None:
        if self.scheduler.grammar_ready(req_id):  # False once the request is gone
            self._wakeup.set()

    def abort_request(self, req_id: str) -> None:
        """Drop a live request now (its stream was cancelled); a no-op once it finished."""
        request = self.scheduler.requests.get(req_id)
        if self._live.pop(req_id) is not None and self.scheduler.abort_request(req_id):
            self.state.request_finished(req_id, "abort", 0, 0)
            self.observer.finished(req_id, "abort", request.num_prompt_tokens, request.num_output_tokens)
            self._wakeup.set()  # tell the worker to drop its mirror promptly

    def fail_request(self, req_id: str, error: Exception) -> None:
        """End a live request with an error on its stream; its blocks are free at once."""
        live = self._live.pop(req_id)
        if live is not None:
            live.queue.put_nowait(error)
            self.observer.forget(req_id)
            if self.scheduler.abort_request(req_id):
                self.state.request_finished(req_id, "error", 0, 0)
            self._wakeup.set()

    def fail_all(self, error: Exception) -> None:
        for live in self._live:
            self.fail_request(live.req_id, error)

    def hand_off_all(self) -> int:
        """Draining: end every live request with HANDOFF at this step boundary, after the outputs already produced
        (so its stream carries each token once and the gateway resumes it from there); returns how many."""
        num_handed_off = self.outputs.dispatch(self.scheduler.hand_off_all())
        self.outputs.deliver()
        self._wakeup.set()  # tell the worker to drop their mirrors
        return num_handed_off

    def worker_lost(self, error: WorkerUnavailable) -> None:
        """Stop taking requests; the loop fails the live ones and waits for the worker (once, however often told)."""
        if self._lost is None and not self.recovering:
            self._lost = error
            self.readiness.set(NotReady.WORKER_LOST)
            if self._lost_signal is not None and not self._lost_signal.done():
                self._lost_signal.set_result(None)  # a step in flight is abandoned
            self._wakeup.set()

    async def run(self) -> None:
        try:
            while True:
                if self._lost is not None:
                    await self._recover(self._lost)
                elif self._in_flight or self.scheduler.has_schedulable_requests() or self.scheduler.finished_req_ids:
                    await self.step()
                else:
                    await self._idle()
        finally:  # stopped (shutdown): nobody waits for the steps in flight any more
            self._in_flight.drop()

    async def _idle(self) -> None:
        """Hand out the last outputs and sleep until something arrives (in debug mode, after the leak check)."""
        self.outputs.deliver()
        if self.check_integrity_when_idle:
            require_integrity(self.scheduler, self._live.ids())
        self._wakeup.clear()
        self._resumed = True
        await self._wakeup.wait()

    async def step(self) -> None:
        """Send the next step while fewer than `max_in_flight` are out; once it is out, hand the last outputs to their
        streams; then wait for the oldest step in flight when the pipeline is full or nothing else can be sent."""
        if self.late_planning and len(self._in_flight) == 1 and await self._plan_late():
            return
        sent = not self._in_flight.full and self._send_next()
        await asyncio.sleep(0)  # the step goes out before the streams the last outputs wake
        self.outputs.deliver()
        if not self._in_flight:
            self._resumed = True
            await asyncio.sleep(0.005)  # nothing fits right now; let aborts and arrivals run
        elif not sent or self._in_flight.full:
            await self._finish_oldest()

    async def _plan_late(self) -> bool:
        """While requests arrive, plan the next step shortly before the running one is expected to end rather than as
        it starts, so that arrivals meanwhile join it (a step less of TTFT under load); the lead covers planning and
        the trip to the worker. True when the loop must look again first (the worker was lost meanwhile)."""
        step_time_s = self.admission.estimator.step_time_s
        if step_time_s is None or time.perf_counter() - self._last_arrival_s > ARRIVALS_WINDOW_S:
            return False
        delay_s = self._in_flight.oldest_ends_in_s(self.admission.estimator) - max(
            MIN_PLAN_LEAD_S, PLAN_LEAD_FRACTION * step_time_s)
        if delay_s <= 0:
            return False
        self.outputs.deliver()  # the streams get the last outputs while the step runs
        running = self._in_flight.oldest
        waits = {running.reply} if self._lost_signal is None else {running.reply, self._lost_signal}
        await asyncio.wait(waits, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED)
        return self._lost is not None

    def _send_next(self) -> bool:
        """Schedule a step and send it; False when there is nothing to send."""
        scheduled = self.scheduler.schedule()
        step = scheduled.step_input
        if step.is_empty and not step.finished_req_ids:
            return False
        self.num_steps += 1
        back_to_back, self._resumed = not self._resumed, False
        self.observer.step_planned(scheduled, self.num_steps)
        span = self.tracer.span_of(step, self.num_steps)  # the worker's step span becomes its child
        reply = self.worker.submit(step, self.num_steps, self.tracer.traceparents(step),
                                   traceparent_of(span) if span else "")
        self._in_flight.append(InFlight(scheduled, reply, time.perf_counter(), back_to_back, span))
        return True

    async def _finish_oldest(self) -> None:
        """Wait for the oldest step's output and apply it. The step is given up when it fails, passes its deadline
        (--step-progress-timeout-s) or the worker is found lost; the loop then recovers."""
        sent = self._in_flight.oldest
        if self._lost_signal is None:  # one plain future until the worker is lost: no task per step
            self._lost_signal = asyncio.get_running_loop().create_future()
            if self._lost is not None:
                self._lost_signal.set_result(None)
        # asyncio.wait, not wait_for: Python 3.11's wait_for can swallow the loop's cancellation at shutdown
        await asyncio.wait({sent.reply, self._lost_signal}, timeout=self.worker.step_timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
        sent.end_span()
        if self._lost is not None:
            return  # the worker was found lost while this step ran: its output is not trusted
        if not sent.reply.done():
            self.worker_lost(WorkerUnavailable(f"worker step failed: DEADLINE_EXCEEDED: no reply within "
                                               f"{self.worker.step_timeout_s}s"))
            return
        self.last_step_end_s = time.monotonic()
        try:
            output = sent.reply.result()
        except grpc.aio.AioRpcError as exc:
            self.worker_lost(WorkerUnavailable(f"worker step failed: {exc.code().name}: {exc.details()}"))
            return
        if output.incarnation_id != sent.scheduled.step_input.incarnation_id:  # it applied nothing: our block ids
            self.worker_lost(WorkerUnavailable("the worker restarted; requests in flight were lost"))  # are not its own
            return
        duration_s = self._in_flight.pop_oldest(time.perf_counter())
        self.scheduler.counters.record_worker_times(output.forward_time_ns, output.sample_time_ns,
                                                 output.idle_time_ns if sent.back_to_back else 0)
        num_finished = self.outputs.dispatch(self.scheduler.update_from_output(sent.scheduled, output))
        self.admission.estimator.record_step(duration_s, num_finished, sent.num_tokens)

    async def _recover(self, error: WorkerUnavailable) -> None:
        """Fail every live request, wait for the worker, and start over with a fresh scheduler."""
        log.error("%s; failing %d requests and waiting for the worker", error, len(self._live))
        self.recovering, self._lost = True, None
        self._lost_signal = None
        await self.worker.reset_stream()  # the steps in flight fail with it
        self._in_flight.drop()
        self.outputs.deliver()  # the last step's outputs reach their streams before the error does
        self.fail_all(error)
        old = self.scheduler.description
        description = await self.worker.wait_until_ready()
        # a restarted worker has an empty KV pool: the old prefix index would serve garbage, old block ids may lie
        # past its pool. The same incarnation still holds the mirrors of the requests just failed: drop them.
        lost_mirrors = self.scheduler.finished_req_ids if same_worker(old, description) else []
        self.scheduler = Scheduler(self.scheduler.config, description)
        self.grammars.forget()
        self.scheduler.finished_req_ids = lost_mirrors
        self.recovering = False
        self.readiness.set(NotReady.WORKER_NOT_SERVING, False)
        self.readiness.set(NotReady.WORKER_LOST, False)
        log.info("worker at %s is back (incarnation %s, %d KV blocks of %d tokens)", self.worker.address,
                 description.incarnation_id, description.num_kv_blocks, description.block_size)
