"""The worker's step entry point: applies the scheduler's deltas to its request mirrors, then runs the step.

Every Worker is a new incarnation with an empty KV pool: a step addressed to another incarnation (the scheduler's
block ids belong to a worker that is gone) is answered with this incarnation's id and nothing else. A request the
worker cannot run fails alone (`StepOutput.failed`); its step-mates go on.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import TYPE_CHECKING

from services.gpu_worker.model_runner import ModelRunner
from services.gpu_worker.request_checks import WorkerLimits, check_cached_request, check_new_request
from services.gpu_worker.request_state import RequestState
from services.gpu_worker.spec_decode.drafts import attach_drafts
from services.gpu_worker.worker_config import WorkerConfig
from shared.step_protocol import FailedRequest, ModelDescription, NewRequest, StepInput, StepOutput
from shared.structured_output import StructuredOutput

if TYPE_CHECKING:  # xgrammar loads with the first grammar
    from services.gpu_worker.grammar import GrammarCache


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.runner = ModelRunner(config)
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
            from services.gpu_worker.grammar import GrammarCache

            self._grammars = GrammarCache(self.runner.config.model_dir, self.runner.model_config.vocab_size,
                                          self.runner.eos_token_ids)
        return self._grammars

    def prepare_grammar(self, structured: StructuredOutput) -> None:
        """Compile a grammar before its request's first step (blocks the caller, never the step thread);
        raises GrammarError when the grammar engine refuses it."""
        self.grammars.get(structured)

    def execute_step(self, step: StepInput) -> StepOutput:
        if step.incarnation_id and step.incarnation_id != self.incarnation_id:
            return StepOutput(incarnation_id=self.incarnation_id)  # block ids of a worker that is gone: touch nothing
        for req_id in step.finished_req_ids:
            self.requests.pop(req_id, None)
        failed = self._apply_deltas(step)
        failed |= attach_drafts(step, self.requests)
        scheduled = {req_id: n for req_id, n in step.num_scheduled_tokens.items() if req_id not in failed}
        for req_id in [r for r in scheduled if r not in self.requests]:
            failed[req_id] = FailedRequest(req_id, "scheduled but unknown to the worker", invalid_argument=False)
            del scheduled[req_id]
        output = StepOutput()
        if scheduled:
            output = self.runner.run([self.requests[r] for r in scheduled], list(scheduled.values()))
        for failure in output.failed:
            self.requests.pop(failure.req_id, None)
        output.failed = [*failed.values(), *output.failed]
        output.incarnation_id = self.incarnation_id
        return output

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
            from services.gpu_worker.grammar import RequestGrammar

            compiled = self.grammars.get(new.sampling.structured_output)
            state.grammar = RequestGrammar.start(compiled, state.output_token_ids)
        return state
