"""The worker's step entry point: applies the scheduler's deltas to its request mirrors, then runs the step."""

from __future__ import annotations

from services.gpu_worker.model_runner import ModelRunner
from services.gpu_worker.request_state import RequestState
from services.gpu_worker.worker_config import WorkerConfig
from shared.step_protocol import CachedRequest, ModelDescription, NewRequest, StepInput, StepOutput


class StepProtocolError(RuntimeError):
    """The scheduler and the worker disagree about a request (a bug on one side, never user input)."""


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.runner = ModelRunner(config)
        self.requests: dict[str, RequestState] = {}

    def describe(self) -> ModelDescription:
        return self.runner.describe()

    def execute_step(self, step: StepInput) -> StepOutput:
        for req_id in step.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in step.new_requests:
            self.requests[new.req_id] = self._mirror(new)
        for cached in step.cached_requests:
            self._apply(cached)
        if step.is_empty:
            return StepOutput()
        try:
            scheduled = [self.requests[req_id] for req_id in step.num_scheduled_tokens]
        except KeyError as exc:
            raise StepProtocolError(f"request {exc.args[0]} scheduled but unknown to the worker") from None
        return self.runner.run(scheduled, list(step.num_scheduled_tokens.values()))

    def _mirror(self, new: NewRequest) -> RequestState:
        """ignore_eos bans the model's EOS ids (as llama.cpp's server does): the answer runs to max_tokens as text,
        not as EOS and template tokens that the text then hides."""
        eos = self.runner.eos_token_ids
        stops = tuple(new.sampling.stop_token_ids) + (() if new.sampling.ignore_eos else eos)
        return RequestState(new.req_id, list(new.token_ids), new.num_prompt_tokens, new.sampling,
                            list(new.block_ids), new.num_computed_tokens, stops,
                            eos if new.sampling.ignore_eos else ())

    def _apply(self, cached: CachedRequest) -> None:
        state = self.requests.get(cached.req_id)
        if state is None:
            raise StepProtocolError(f"request {cached.req_id} sent as cached but unknown to the worker")
        if state.num_computed_tokens != cached.num_computed_tokens:
            raise StepProtocolError(f"request {cached.req_id}: worker computed {state.num_computed_tokens} tokens, "
                                    f"scheduler says {cached.num_computed_tokens}")
        state.block_ids.extend(cached.new_block_ids)
