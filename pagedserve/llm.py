"""Offline batch generation (like vLLM's `LLM.generate`): prompts and sampling params in, completions out."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace

from pagedserve.llm_engine import LLMEngine
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import TokenLogprobs

Prompt = str | list[int]


@dataclass
class Completion:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_cached_tokens: int = 0
    text: str = ""
    # with SamplingParams.prompt_logprobs: one per prompt token after the first (token_id: the prompt's token)
    prompt_logprobs: list[TokenLogprobs] | None = None


def chat_token_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The conversation rendered by the model's chat template, ready for the assistant's turn."""
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def with_speculative_config(worker_config: WorkerConfig, scheduler_config: SchedulerConfig, text: str = ""
                            ) -> tuple[WorkerConfig, SchedulerConfig]:
    """Both configs with the one speculative config: `text`, else whichever of the two has one (the scheduler plans
    the drafts, the worker runs a draft model); ValueError when they name different ones."""
    given = {c for c in (text, worker_config.speculative_config, scheduler_config.speculative_config) if c}
    if len(given) > 1 and not text:
        raise ValueError("the worker's and the scheduler's speculative_config differ: give one")
    chosen = text or next(iter(given), "")
    return (replace(worker_config, speculative_config=chosen), replace(scheduler_config, speculative_config=chosen))


class LLM:
    """`speculative_config`: vLLM's JSON (docs/speculative_decoding.md), for both the scheduler and the worker
    (either config may carry it instead)."""

    def __init__(self, worker_config: WorkerConfig, scheduler_config: SchedulerConfig | None = None,
                 async_scheduling: bool = False, speculative_config: str = "") -> None:
        from transformers import AutoTokenizer

        worker_config, scheduler_config = with_speculative_config(worker_config, scheduler_config or SchedulerConfig(),
                                                                  speculative_config)
        self.engine = LLMEngine(Worker(worker_config), scheduler_config, async_scheduling)
        self.tokenizer = AutoTokenizer.from_pretrained(worker_config.model_dir)

    def chat_prompt(self, user_message: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn conversation through the model's chat template."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user_message}]
        return chat_token_ids(self.tokenizer, messages)

    def generate(self, prompts: list[Prompt], sampling: SamplingParams | list[SamplingParams],
                 cache_salt: str | None = None) -> list[Completion]:
        """Run all prompts to completion through the scheduler; results in prompt order."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        completions: dict[str, Completion] = {}
        for prompt, sp in zip(prompts, params, strict=True):
            token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            req_id = uuid.uuid4().hex
            self.engine.add_request(GenerateRequest(req_id, token_ids, sp, cache_salt))
            completions[req_id] = Completion(prompt_token_ids=token_ids)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                completion = completions[out.req_id]
                completion.token_ids.extend(out.new_token_ids)
                completion.logprobs.extend(out.new_logprobs)
                if out.prompt_logprobs is not None:
                    completion.prompt_logprobs = out.prompt_logprobs
                completion.num_cached_tokens = out.num_cached_tokens
                completion.finish_reason = out.finish_reason
        for completion in completions.values():
            completion.text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        return list(completions.values())
