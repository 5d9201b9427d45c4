"""The worker's step entry point: applies the scheduler's deltas to its request mirrors, then runs the step.

Every Worker is a new incarnation with an empty KV pool: a step addressed to another incarnation (the scheduler's
block ids belong to a worker that is gone) is answered with this incarnation's id and nothing else. A request the
worker cannot run fails alone (`StepOutput.failed`); its step-mates go on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.pending_output import PendingOutput
from pagedserve.services.gpu_worker.request_checks import WorkerLimits, check_cached_request, check_new_request
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.spec_decode.drafts import attach_drafts, attach_model_drafts
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.step_protocol import FailedRequest, ModelDescription, NewRequest, StepInput, StepOutput
from pagedserve.shared.structured_output import StructuredOutput

if TYPE_CHECKING:  # xgrammar loads with the first grammar
    from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup
    from pagedserve.shared.grammar_cache import GrammarCache


class Worker:
    """`tp`: this rank's tensor-parallel group (None: one device); parallel/leader.py and follower.py extend it."""

    def __init__(self, config: WorkerConfig, tp: TensorParallelGroup | None = None) -> None:
        self.runner = ModelRunner(config, tp)
        self.requests: dict[str, RequestState] = {}
        self.incarnation_id = uuid.uuid4().hex  # new on every start: the KV pool starts empty
        description = self.runner.describe()
        self.limits = WorkerLimits(description.vocab_size, description.num_kv_blocks, description.max_model_len)
        self._grammars: GrammarCache | None = None

    def describe(self) -> ModelDescription:
        return replace(self.runner.describe(), incarnation_id=self.incarnation_id)

    @property
    def grammars(self) -> GrammarCache:
        if self._grammars is None:
            from pagedserve.shared.grammar_cache import GrammarCache

            self._grammars = GrammarCache(self.runner.config.model_dir, self.runner.model_config.vocab_size,
                                          self.runner.eos_token_ids)
        return self._grammars

    def prepare_grammar(self, structured: StructuredOutput) -> None:
        """Compile a grammar before its request's first step (blocks the caller, never the step thread);
        raises GrammarError when the grammar engine refuses it."""
        self.grammars.get(structured)

    def execute_step(self, step: StepInput) -> StepOutput:
        return self.launch_step(step).result()

    def launch_step(self, step: StepInput) -> PendingStep:
        """Enqueue the step; its output comes from `result()`, which a caller with the next step at hand calls
        after launching that one (the sampled ids then reach the host without stalling the device)."""
        if step.incarnation_id and step.incarnation_id != self.incarnation_id:
            # block ids of a worker that is gone: touch nothing
            return PendingStep(self, None, StepOutput(incarnation_id=self.incarnation_id), [])
        for req_id in step.finished_req_ids:
            self.requests.pop(req_id, None)
        failed = self._apply_deltas(step)
        failed |= attach_drafts(step, self.requests)
        if step.draft_model_slots:
            drafter = self.runner.drafter
            failed |= attach_model_drafts(step, self.requests, drafter.propose if drafter is not None else None)
        scheduled = {req_id: n for req_id, n in step.num_scheduled_tokens.items() if req_id not in failed}
        for req_id in [r for r in scheduled if r not in self.requests]:
            failed[req_id] = FailedRequest(req_id, "scheduled but unknown to the worker", invalid_argument=False)
            del scheduled[req_id]
        self._before_run(step, failed, scheduled)
        pending = None
        if scheduled:
            pending = self.runner.launch([self.requests[r] for r in scheduled], list(scheduled.values()))
        return PendingStep(self, pending, StepOutput(), list(failed.values()))

    def _before_run(self, step: StepInput, failed: dict[str, Any], scheduled: dict[str, int]) -> None:
        """Called with the step's deltas applied, before its forward (the tensor-parallel leader broadcasts here)."""

    def _apply_deltas(self, step: StepInput) -> dict[str, FailedRequest]:
        """Mirror new requests and extend cached ones; those that fail a check are dropped and returned."""
        failed: dict[str, FailedRequest] = {}
        for new in step.new_requests:
            failure = check_new_request(new, self.limits)
            if failure is None:
                try:
                    self.requests[new.req_id] = self._mirror(new)
                    continue
                except ValueError as exc:  # GrammarError: a grammar evicted or lost with a restart fails to compile
                    failure = FailedRequest(new.req_id, str(exc), invalid_argument=True)
            self.requests.pop(new.req_id, None)
            failed[new.req_id] = failure
        for cached in step.cached_requests:
            state = self.requests.get(cached.req_id)
            failure = check_cached_request(cached, state.num_computed_tokens if state else None, self.limits)
            if failure is None:
                state.block_ids.extend(cached.new_block_ids)
            else:
                self.requests.pop(cached.req_id, None)
                failed[cached.req_id] = failure
        return failed

    def _mirror(self, new: NewRequest) -> RequestState:
        """ignore_eos bans the model's EOS ids (as llama.cpp's server does): the answer runs to max_tokens as text,
        not as EOS and template tokens that the text then hides."""
        eos = self.runner.eos_token_ids
        stops = tuple(new.sampling.stop_token_ids) + (() if new.sampling.ignore_eos else eos)
        state = RequestState(new.req_id, list(new.token_ids), new.num_prompt_tokens, new.sampling,
                             list(new.block_ids), new.num_computed_tokens, stops,
                             eos if new.sampling.ignore_eos else ())
        if new.sampling.structured_output is not None:
            from pagedserve.services.gpu_worker.grammar import RequestGrammar

            compiled = self.grammars.get(new.sampling.structured_output)
            state.grammar = RequestGrammar.start(compiled, state.output_token_ids)
        return state


@dataclass
class PendingStep:
    """A launched step: `result()` (once, idempotent) takes the runner's output and drops its failed requests."""

    worker: Worker
    pending: PendingOutput | None
    output: StepOutput
    failed: list[FailedRequest]
    resolved: bool = False

    @property
    def ready(self) -> bool:
        """result() needs no wait for the device."""
        return self.resolved or self.pending is None or self.pending.resolved

    def result(self) -> StepOutput:
        if self.resolved:
            return self.output
        self.resolved = True
        if self.pending is None:
            if self.output.incarnation_id:  # a step for another incarnation
                return self.output
        else:
            self.output = self.pending.result()
        for failure in self.output.failed:
            state = self.worker.requests.get(failure.req_id)
            if state is not None and state.dropped:
                del self.worker.requests[failure.req_id]
        self.output.failed = [*self.failed, *self.output.failed]
        self.output.incarnation_id = self.worker.incarnation_id
        return self.output
