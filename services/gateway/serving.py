"""What every endpoint needs: the scheduler client, tokenizer, model facts, defaults and metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.gateway.admission import Admission
from services.gateway.config import GatewayConfig
from services.gateway.errors import OpenAIError
from services.gateway.generation import ChoiceJob
from services.gateway.metrics import GatewayMetrics
from services.gateway.protocol import SamplingFields
from services.gateway.sampling import ModelLimits, RequestShape, build_sampling_params, prompt_too_long
from services.gateway.scheduler_client import SchedulerClient
from services.gateway.tokenizer import ChatTemplateArgs, PromptTokenizer, PromptTooLong
from shared.request_io import GenerateRequest
from shared.step_protocol import ModelDescription

log = logging.getLogger(__name__)


@dataclass
class Serving:
    config: GatewayConfig
    tokenizer: PromptTokenizer
    client: SchedulerClient
    generation_defaults: dict
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    admission: Admission = field(init=False)
    description: ModelDescription | None = None  # the model facts, set once the scheduler described its worker
    ready: bool = False  # the scheduler reports SERVING
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models `created`: when this gateway started

    def __post_init__(self) -> None:
        self.admission = Admission(self.config.max_open_requests)

    def require_model(self, requested: str | None) -> ModelDescription:
        """The served model; 503 before the scheduler is ready, 404 for another model name."""
        if not self.ready or self.description is None:
            raise OpenAIError(503, "the scheduler is not ready yet", code="service_unavailable")
        if requested not in (None, self.description.model_name, self.config.model_dir, self.model_root):
            raise OpenAIError(404, f"The model `{requested}` does not exist.", param="model",
                              code="model_not_found")
        return self.description

    @property
    def model_root(self) -> str:
        """The model folder as an absolute path (/v1/models `root`: a client on this machine can load its tokenizer)."""
        return str(Path(self.config.model_dir).resolve())

    @property
    def limits(self) -> ModelLimits:
        assert self.description is not None, "require_model() first"
        return ModelLimits(self.description.max_model_len, self.description.vocab_size)

    async def encode_prompt(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids, tokenized off the event loop; a text that surely cannot fit the context is a 400
        without tokenizing it."""
        try:
            return await self.tokenizer.off_loop(self.tokenizer.encode, text, add_special_tokens,
                                                 self.limits.max_model_len)
        except PromptTooLong as exc:
            raise prompt_too_long(exc.num_tokens, self.limits.max_model_len, param, at_least=True) from None

    async def encode_chat(self, messages: list[dict[str, str]], args: ChatTemplateArgs | None = None,
                          param: str = "messages") -> list[int]:
        """Token ids of the conversation through the chat template, templated and tokenized off the event loop."""
        try:
            return await self.tokenizer.off_loop(self.tokenizer.chat_prompt_ids, messages, args,
                                                 self.limits.max_model_len)
        except PromptTooLong as exc:
            raise prompt_too_long(exc.num_tokens, self.limits.max_model_len, param, at_least=True) from None

    def build_jobs(self, body: SamplingFields, prompts: list[list[int]], req_id: str, max_tokens: int | None,
                   logprobs: int | None, shape: RequestShape) -> list[ChoiceJob]:
        """n scheduler requests per prompt; one req_id when there is one choice, `{req_id}-{i}` otherwise."""
        limit, num_choices = self.config.max_num_choices, len(prompts) * body.n
        if body.n > limit:
            raise OpenAIError(400, f"n must be at most {limit}, got {body.n}", param="n")
        if num_choices > limit:
            raise OpenAIError(400, f"a request may ask for at most {limit} choices (prompts x n), got "
                                   f"{len(prompts)} x {body.n}", param=shape.prompt_param)
        jobs = []
        for prompt_index, prompt_ids in enumerate(prompts):
            for i in range(body.n):
                params = build_sampling_params(body, max_tokens, logprobs, len(prompt_ids), i,
                                               self.generation_defaults, self.limits, shape)
                index = len(jobs)
                choice_id = req_id if num_choices == 1 else f"{req_id}-{index}"
                jobs.append(ChoiceJob(index, prompt_index, GenerateRequest(choice_id, prompt_ids, params,
                                                                           body.cache_salt), body.stop_strings))
        return jobs

    async def watch_scheduler(self) -> None:
        """Poll the scheduler's health forever; describe its model when it becomes ready."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.config.health_poll_interval_s)

    async def refresh(self) -> bool:
        """Ask the scheduler now whether it serves (describing its model the first time); returns `ready`."""
        serving = await self.client.is_serving()
        if serving and self.description is None:
            try:
                self.description = await self.client.describe()
            except Exception as exc:  # retried at the next poll
                log.warning("describe failed: %s", exc)
                serving = False
        if serving != self.ready:
            if serving:
                log.info("scheduler at %s ready: serving %s (context %d)", self.client.address,
                         self.description.model_name, self.description.max_model_len)
            else:
                log.warning("scheduler at %s unavailable", self.client.address)
        self.ready = serving and self.description is not None
        return self.ready
