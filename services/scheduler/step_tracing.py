"""The traces of engine steps: every Nth step gets a span of its own, linked to the request spans it serves (a step
belongs to no one request); the worker's step span becomes its child. A request's W3C traceparent goes to the worker
with its first step."""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry import trace

from pagedserve.services.scheduler.live_request import LiveRequests
from pagedserve.shared.step_protocol import StepInput


class StepTracer:
    def __init__(self, live: LiveRequests, trace_step_interval: int, get_tracer: Callable[[], trace.Tracer]) -> None:
        self.live = live
        self.get_tracer = get_tracer
        self.trace_step_interval = trace_step_interval  # every Nth step gets a span; 0: none

    def span_of(self, step: StepInput, step_id: int) -> trace.Span | None:
        """The step's own span when it is sampled (the caller ends it), else None."""
        if not self.trace_step_interval or step_id % self.trace_step_interval:
            return None
        links = []
        for req_id in step.num_scheduled_tokens:
            live = self.live.get(req_id)
            if live is not None and live.span_context is not None:
                links.append(trace.Link(live.span_context))
        return self.get_tracer().start_span(
            "scheduler.step", context=trace.set_span_in_context(trace.INVALID_SPAN), links=links,
            attributes={"step_id": step_id, "num_requests": len(step.num_scheduled_tokens),
                        "num_scheduled_tokens": step.total_num_scheduled_tokens})

    def traceparents(self, step: StepInput) -> dict[str, str]:
        """req_id -> traceparent for the step's new requests that carry one."""
        found = {}
        for new in step.new_requests:
            live = self.live.get(new.req_id)
            if live is not None and live.traceparent:
                found[new.req_id] = live.traceparent
        return found
