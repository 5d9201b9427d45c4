"""The steps sent to the worker whose outputs the loop has not applied yet, oldest first, and when they end.

Invariant: at most `max_in_flight` steps are out (2 with async scheduling, else 1); sending one more is a bug.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry import trace

from pagedserve.services.scheduler.admission import QueueWaitEstimator
from pagedserve.services.scheduler.invariants import require
from pagedserve.services.scheduler.scheduler import SchedulerOutput
from pagedserve.shared.step_protocol import StepOutput


def _discard(future: asyncio.Future) -> None:
    """Cancel a future nobody will wait for, or retrieve its error (so that it is not reported as lost)."""
    if not future.cancel() and not future.cancelled():
        future.exception()


@dataclass
class InFlight:
    """A step sent to the worker whose output has not been handed to the scheduler yet."""

    scheduled: SchedulerOutput
    reply: asyncio.Future[StepOutput]
    sent_s: float  # time.perf_counter() when it was sent
    back_to_back: bool  # sent right after the previous step without the loop idling: the worker's wait counts
    span: trace.Span | None  # the step's own span (every trace_step_interval'th step), until it ends

    @property
    def num_tokens(self) -> int:
        return self.scheduled.step_input.total_num_scheduled_tokens

    def end_span(self) -> None:
        if self.span is not None:
            self.span.end()
            self.span = None


class StepsInFlight:
    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight
        self._steps: collections.deque[InFlight] = collections.deque()  # oldest first
        self.last_reply_s = 0.0  # time.perf_counter() when the last step's output came back

    def __len__(self) -> int:
        return len(self._steps)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(self._steps)

    @property
    def full(self) -> bool:
        return len(self._steps) >= self.max_in_flight

    @property
    def oldest(self) -> InFlight:
        return self._steps[0]

    def append(self, sent: InFlight) -> None:
        require(len(self._steps) < self.max_in_flight, f"more than {self.max_in_flight} steps in flight")
        self._steps.append(sent)

    def pop_oldest(self, now_s: float) -> float:
        """The oldest step's output came back at `now_s`; returns the worker's time on it (steps queue back to
        back, so it started when it was sent or when the one before it came back, whichever is later)."""
        sent = self._steps.popleft()
        duration_s = now_s - max(sent.sent_s, self.last_reply_s)
        self.last_reply_s = now_s
        return duration_s

    def oldest_ends_in_s(self, estimator: QueueWaitEstimator) -> float:
        """Seconds until the oldest step is expected back, by its size (0 with none out or before a step was
        timed)."""
        if not self._steps:
            return 0.0
        oldest = self._steps[0]
        step_time_s = estimator.step_s(oldest.num_tokens)
        if step_time_s is None:
            return 0.0
        started_s = max(oldest.sent_s, self.last_reply_s)
        return max(0.0, started_s + step_time_s - time.perf_counter())

    def all_back_in_s(self, estimator: QueueWaitEstimator, oldest_ends_in_s: float) -> float:
        """Seconds until every step is expected back: the oldest's rest, then each one's predicted time (0 before a
        step was timed, when admission predicts no wait anyway)."""
        queued = itertools.islice(self._steps, 1, None)
        return oldest_ends_in_s + sum(estimator.step_s(sent.num_tokens) or 0.0 for sent in queued)

    def drop(self) -> None:
        """Nobody waits for these steps any more (the worker was lost, or the loop stopped)."""
        for sent in self._steps:
            sent.end_span()
            _discard(sent.reply)
        self._steps.clear()
