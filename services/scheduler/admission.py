"""Admission control: a bounded waiting queue and a predicted queue time, so overload gets a quick 429 with a
Retry-After instead of a queue that grows without bound. Only arrivals are refused: a request once accepted is
never dropped for load (preemption recomputes it instead).

A request that would join the next step is never refused for its predicted wait: the requests ahead of it and
it fit the next step's free slots and token budget. Its only wait is the steps already in flight, which no refusal
shortens (refusing it on their account, on a slowed machine, refused nearly everything).

For the others the prediction is in steps, turned into seconds by the recent step time. "Ahead" is per priority
and tenant, as the queue orders (WaitingQueue.ahead_of): waiting requests of a more urgent priority, and of the
same one those of tenants served no more than the request's own; running requests of a less urgent priority give
their slot up (preemption) and do not count.
- steps in flight: the step the worker is running has what its size predicts left (StepTimeModel), a step queued
  behind it (async scheduling) all of its predicted time; a new request's first step can only follow them. Under
  load this is most of the wait, and it grows with the batch (on CPU a step's time grows with its rows), so the
  bound also keeps the running batch small enough for its steps to be short;
- prompt work ahead: the tokens the requests ahead (and running ones still in their prompt) have left, spread
  over what a step has for prompts (the token budget less one token per running decode);
- a free slot: with `max_num_seqs` requests holding slots, a new one waits for as many finishes as there are
  requests ahead of it beyond the free slots, at the recent finishing rate, but never longer than the slots'
  holders and the requests ahead can still produce: each request ends by its `max_tokens` (SlotBound). The rate
  alone ran away while nothing finished (it decays toward 0 and is divided by).

Each refusal also says how long the gateway may refuse further arrivals without asking (`admit_after_s`, at most
`MAX_ADMIT_AFTER_S`): nothing that admission looks at changes before the step in flight ends, so arrivals until
then would be refused too; a predicted-wait refusal promises this only while one priority and one tenant are live
(a more urgent or less served arrival could still be admitted). The gateway sheds them before reading their
bodies, which keeps a flood's parsing, tokenizing and gRPC calls off the cores that run the steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.step_time_model import StepTimeModel
from pagedserve.shared.request_io import GenerateRequest

_SMOOTHING = 0.2  # weight of the newest step in the moving averages
MAX_RETRY_AFTER_S = 60
MAX_ADMIT_AFTER_S = 1.0  # the longest a refusal lets the gateway shed arrivals without asking again


class Overloaded(RuntimeError):
    """The server is too busy to take this request now; retry after `retry_after_s` (a 429). Arrivals within
    `admit_after_s` would be refused as well (0: no such promise)."""

    def __init__(self, message: str, retry_after_s: int, admit_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.admit_after_s = admit_after_s


@dataclass(frozen=True)
class AdmissionConfig:
    max_waiting_requests: int = 1024  # requests queued for their first step at most; more get a 429
    max_waiting_tokens: int = 1_048_576  # prompt tokens queued at most; more get a 429
    max_queue_wait_s: float = 10.0  # refuse (429) a request predicted to wait longer for its first step; 0: no bound

    def __post_init__(self) -> None:
        if self.max_waiting_requests < 1 or self.max_waiting_tokens < 1 or self.max_queue_wait_s < 0:
            raise ValueError("max_waiting_requests and max_waiting_tokens must be positive, max_queue_wait_s >= 0")


class QueueWaitEstimator:
    """Moving averages of the step time and of requests finished per step, and the step time by a step's size, fed
    by the engine loop."""

    def __init__(self) -> None:
        self.step_time_s: float | None = None  # None until a step ran
        self.finishes_per_step: float | None = None  # among steps with running requests; None until one finished
        self.step_model = StepTimeModel()

    def record_step(self, duration_s: float, num_finished: int, num_tokens: int = 0) -> None:
        self.step_time_s = _average(self.step_time_s, duration_s)
        self.step_model.record(num_tokens, duration_s)
        if num_finished or self.finishes_per_step is not None:
            self.finishes_per_step = _average(self.finishes_per_step, float(num_finished))

    def step_s(self, num_tokens: int) -> float | None:
        """The expected time of a step of `num_tokens` tokens (None until a step ran)."""
        return self.step_model.predict_s(num_tokens)

    def predict_s(self, scheduler: Scheduler, num_in_flight: int = 0, in_flight_s: float | None = None,
                  priority: int = 0, tenant: str = "") -> float:
        """Seconds a request of this priority and tenant added now would wait for its first step, with
        `num_in_flight` steps sent to the worker (or, when the caller knows it, `in_flight_s` until they are all
        back)."""
        if self.step_time_s is None:
            return 0.0
        if in_flight_s is None:
            in_flight_s = max(0.0, num_in_flight - 0.5) * self.step_time_s
        ahead = list(scheduler.waiting.ahead_of(priority, tenant))
        steps = max(self._prompt_steps(scheduler, ahead), self._slot_steps(scheduler, ahead, priority))
        return in_flight_s + steps * self.step_time_s

    @staticmethod
    def joins_next_step(scheduler: Scheduler, priority: int = 0, tenant: str = "") -> bool:
        """Whether a request of this priority and tenant added now would be in the next step: it and the requests
        ahead of it find slots (free, or held by less urgent requests) and some of the token budget."""
        config, running = scheduler.config, scheduler.running
        ahead = list(scheduler.waiting.ahead_of(priority, tenant))
        holders = sum(1 for r in running if r.priority <= priority)
        if len(ahead) + holders + 1 > config.max_num_seqs:
            return False
        used = len(running) + sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in running)
        used += sum(r.num_tokens - r.num_computed_tokens for r in ahead)
        return used < config.max_num_batched_tokens

    @staticmethod
    def _prompt_steps(scheduler: Scheduler, ahead: list[Request]) -> float:
        waiting = sum(r.num_tokens - r.num_computed_tokens for r in ahead)
        running = sum(max(0, r.num_prompt_tokens - r.num_computed_tokens) for r in scheduler.running)
        per_step = max(1, scheduler.config.max_num_batched_tokens - len(scheduler.running))
        return (waiting + running) / per_step

    def _slot_steps(self, scheduler: Scheduler, ahead: list[Request], priority: int) -> float:
        max_num_seqs, max_model_len = scheduler.config.max_num_seqs, scheduler.description.max_model_len
        holders = [r for r in scheduler.running if r.priority <= priority]  # less urgent ones are preempted
        num_to_finish = len(ahead) + len(holders) + 1 - max_num_seqs
        if num_to_finish <= 0:
            return 0.0
        bound = slot_bound(holders, ahead, num_to_finish, max_num_seqs, max_model_len)
        return min(num_to_finish / self.finishes_per_step, bound) if self.finishes_per_step else bound


def slot_bound(holders: list[Request], ahead: list[Request], num_to_finish: int, max_num_seqs: int,
               max_model_len: int) -> float:
    """Steps until a request behind `ahead` gets a slot, at most, if each request ends by its `max_tokens` (one
    output a step once it holds a slot):
    - while `num_to_finish` is no more than the holders, the num_to_finish-th holder to run out of tokens frees
      enough slots (the requests ahead can only free theirs sooner);
    - whatever the number, slots go to the requests ahead as they free (list scheduling), so the new request's slot
      is free no later than the mean work per slot: holders' tokens left plus those ahead's, over the slots."""
    def left(r: Request) -> int:
        return max(0, min(r.sampling.max_tokens - r.num_output_tokens, max_model_len - r.num_tokens))

    held = [left(r) for r in holders]
    bound = (sum(held) + sum(left(r) for r in ahead)) / max_num_seqs
    if num_to_finish <= len(held):
        bound = min(bound, sorted(held)[num_to_finish - 1])
    return float(bound)


def _one_class(scheduler: Scheduler, priority: int, tenant: str) -> bool:
    """Whether every live request, and every tenant recently served, has this priority and tenant."""
    running = scheduler.running
    return (scheduler.waiting.only(priority, tenant) and set(scheduler.fair_share.tenants) <= {tenant}
            and (not running or running[0].priority == running[-1].priority == priority))


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + _SMOOTHING * (new - old)


class AdmissionControl:
    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.estimator = QueueWaitEstimator()
        self.num_refused = 0

    def check(self, scheduler: Scheduler, request: GenerateRequest, num_in_flight: int = 0,
              step_ends_in_s: float = 0.0, in_flight_s: float | None = None) -> None:
        """Raises Overloaded when the queue is full or the request would wait longer than the bound;
        `step_ends_in_s`: when the oldest step in flight is expected back (the earliest the answer can change);
        `in_flight_s`: when all steps in flight are (see QueueWaitEstimator.predict_s)."""
        config, priority, tenant = self.config, request.priority, request.tenant
        predicted_s = self.estimator.predict_s(scheduler, num_in_flight, in_flight_s, priority, tenant)
        waiting_tokens = sum(r.num_tokens for r in scheduler.waiting)
        if len(scheduler.waiting) >= config.max_waiting_requests:
            self._refuse(f"{len(scheduler.waiting)} requests are waiting (at most {config.max_waiting_requests})",
                         predicted_s, step_ends_in_s)
        num_tokens = len(request.prompt_token_ids) + len(request.resumed_output_token_ids)  # all recomputed here
        if waiting_tokens + num_tokens > config.max_waiting_tokens:
            full = waiting_tokens >= config.max_waiting_tokens  # else a shorter prompt may still fit: no promise
            self._refuse(f"{waiting_tokens} prompt tokens are waiting (at most {config.max_waiting_tokens})",
                         predicted_s, step_ends_in_s if full else 0.0)
        if (config.max_queue_wait_s and predicted_s > config.max_queue_wait_s
                and not self.estimator.joins_next_step(scheduler, priority, tenant)):
            excess_s = predicted_s - config.max_queue_wait_s
            # the gateway sheds without reading bodies: promise only while no arrival can be more urgent or
            # less served than this one (one priority and one tenant live, as with no tenants configured)
            promise_s = max(excess_s, step_ends_in_s) if _one_class(scheduler, priority, tenant) else 0.0
            self._refuse(f"the predicted queue time is {predicted_s:.2f}s (at most {config.max_queue_wait_s:g}s)",
                         excess_s, promise_s)

    def _refuse(self, why: str, wait_s: float, admit_after_s: float) -> None:
        self.num_refused += 1
        raise Overloaded(f"the server is overloaded: {why}; retry later",
                         min(MAX_RETRY_AFTER_S, max(1, math.ceil(wait_s))),
                         min(MAX_ADMIT_AFTER_S, max(0.0, admit_after_s)))
