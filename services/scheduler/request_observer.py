"""A request's life in the engine loop, seen once and told twice: as events on its span and as latency histograms.

Events on the request's `scheduler.generate` span (names and attributes are listed in docs/operations.md):
  queued         the request entered the waiting queue
  scheduled      a step admitted it (again after a preemption); attribute num_cached_tokens: prefix-cache hit
  prefill_chunk  a step computes part of its prompt (or its recompute after a preemption)
  first_token    its first output token was sampled
  preempted      its blocks were taken back; it waits to be recomputed
  finished       it ended (finish_reason)
Histograms (metrics.py) use the same instants: arrival, first scheduled, first token, each token, the end.

Called from the engine loop's thread only; per step it touches only the requests in the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from opentelemetry import trace
from prometheus_client import Histogram

from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.scheduler import SchedulerOutput
from pagedserve.shared.request_io import RequestOutput


@dataclass
class RequestTimes:
    """Monotonic instants of one request, in seconds."""

    arrival_s: float
    span: trace.Span | None  # None when its span records nothing (tracing off or not sampled)
    scheduled_s: float | None = None  # first admission
    first_token_s: float | None = None
    last_token_s: float | None = None
    prefilling: bool = False  # admitted (or re-admitted) and not yet sampled: its steps compute prompt


class RequestObserver:
    def __init__(self, metrics: SchedulerMetrics | None, model_name: str) -> None:
        self.requests: dict[str, RequestTimes] = {}
        self._histograms = None if metrics is None else _ModelHistograms.of(metrics, model_name)

    def arrived(self, req_id: str, num_prompt_tokens: int, span: trace.Span | None) -> None:
        recording = span if span is not None and span.is_recording() else None
        self.requests[req_id] = RequestTimes(time.monotonic(), recording)
        if recording is not None:
            recording.add_event("queued", {"num_prompt_tokens": num_prompt_tokens})

    def step_planned(self, scheduled: SchedulerOutput, step_id: int) -> None:
        """Before the worker runs the step: admissions, prefill chunks and preemptions of this step."""
        now_s = time.monotonic()
        step = scheduled.step_input
        if self._histograms is not None:
            self._histograms.iteration_tokens.observe(step.total_num_scheduled_tokens)
        for req_id in scheduled.preempted_req_ids:
            times = self.requests.get(req_id)
            if times is not None and times.span is not None:
                times.span.add_event("preempted", {"step_id": step_id})
        for new in step.new_requests:
            times = self.requests.get(new.req_id)
            if times is None:
                continue
            resumed = times.scheduled_s is not None
            if not resumed:
                times.scheduled_s = now_s
            times.prefilling = True
            if times.span is not None:
                times.span.add_event("scheduled", {"step_id": step_id, "num_cached_tokens": new.num_computed_tokens,
                                                   "resumed": resumed})
        for req_id, num_tokens in step.num_scheduled_tokens.items():
            times = self.requests.get(req_id)
            if times is not None and times.span is not None and times.prefilling:
                times.span.add_event("prefill_chunk", {"step_id": step_id, "num_tokens": num_tokens})

    def produced(self, output: RequestOutput) -> None:
        """A step's output for the request: time to first token, then inter-token latencies."""
        times = self.requests.get(output.req_id)
        if times is None or not output.new_token_ids:
            return
        now_s = time.monotonic()
        times.prefilling = False
        if times.first_token_s is None:
            times.first_token_s = now_s
            if self._histograms is not None:
                self._histograms.time_to_first_token.observe(now_s - times.arrival_s)
            if times.span is not None:
                times.span.add_event("first_token")
        elif self._histograms is not None:
            self._histograms.inter_token_latency.observe((now_s - times.last_token_s) / len(output.new_token_ids))
        times.last_token_s = now_s

    def finished(self, req_id: str, finish_reason: str, num_prompt_tokens: int, num_output_tokens: int) -> None:
        times = self.requests.pop(req_id, None)
        if times is None:
            return
        end_s = time.monotonic()
        if times.span is not None:
            times.span.add_event("finished", {"finish_reason": finish_reason, "num_output_tokens": num_output_tokens})
        h = self._histograms
        if h is None:
            return
        h.e2e_request_latency.observe(end_s - times.arrival_s)
        h.request_prompt_tokens.observe(num_prompt_tokens)
        h.request_generation_tokens.observe(num_output_tokens)
        if times.scheduled_s is not None:
            h.request_queue_time.observe(times.scheduled_s - times.arrival_s)
            h.request_inference_time.observe(end_s - times.scheduled_s)
            if times.first_token_s is not None:
                h.request_prefill_time.observe(times.first_token_s - times.scheduled_s)
                h.request_decode_time.observe(end_s - times.first_token_s)

    def forget(self, req_id: str) -> None:
        """Drop a request without recording an end (the engine lost it with its worker)."""
        self.requests.pop(req_id, None)


@dataclass(frozen=True)
class _ModelHistograms:
    """The histograms' children for one model_name, bound once so that observing skips the label lookup."""

    time_to_first_token: Histogram
    inter_token_latency: Histogram
    e2e_request_latency: Histogram
    request_queue_time: Histogram
    request_prefill_time: Histogram
    request_decode_time: Histogram
    request_inference_time: Histogram
    request_prompt_tokens: Histogram
    request_generation_tokens: Histogram
    iteration_tokens: Histogram

    @classmethod
    def of(cls, metrics: SchedulerMetrics, model_name: str) -> _ModelHistograms:
        return cls(**{f.name: getattr(metrics, f.name).labels(model_name) for f in fields(cls)})
