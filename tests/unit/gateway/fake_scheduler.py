"""An in-memory stand-in for the scheduler client: replies with a fixed text, one token per output."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from services.proto_convert.scheduler_contract import generate_request_to_pb
from services.scheduler.scheduler_stats import SchedulerStats
from shared.request_io import FinishReason, GenerateRequest, RequestOutput
from shared.step_protocol import ModelDescription, TokenLogprobs

EOS = 2
DESCRIPTION = ModelDescription(model_name="tiny-model", architecture="LlamaForCausalLM", max_model_len=256,
                                vocab_size=49152, num_kv_blocks=64, block_size=16, eos_token_ids=(EOS,),
                                dtype="float32", device="cpu", attention_backend="torch", kv_cache_bytes=1)


class FakeSchedulerClient:
    def __init__(self, tokenizer, reply: str = "The capital of France is Paris.", serving: bool = True) -> None:
        self.reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [EOS]
        self.serving = serving
        self.fail_after: tuple[int, Exception] | None = None  # (outputs sent, error): the scheduler fails mid-way
        self.address = "fake"
        self.requests: list[GenerateRequest] = []
        self.cancelled: list[str] = []  # req_ids whose stream was closed before it finished

    def connect(self) -> None:
        pass

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        generate_request_to_pb(request)  # what the real client sends: raises where a value does not fit the wire
        self.requests.append(request)
        finished = False
        try:
            for n, token_id in enumerate(self.reply_ids[:request.sampling.max_tokens], start=1):
                if self.fail_after is not None and n > self.fail_after[0]:
                    raise self.fail_after[1]
                finished = token_id == EOS or n == request.sampling.max_tokens
                reason = None if not finished else FinishReason.STOP if token_id == EOS else FinishReason.LENGTH
                yield RequestOutput(request.req_id, [token_id], [self._logprobs(request, token_id)], reason,
                                    len(request.prompt_token_ids), 0, n)
                if finished:
                    return
                await asyncio.sleep(0)
        finally:
            if not finished:
                self.cancelled.append(request.req_id)

    @staticmethod
    def _logprobs(request: GenerateRequest, token_id: int) -> TokenLogprobs | None:
        n = request.sampling.logprobs
        if n is None:
            return None
        return TokenLogprobs(token_id, -0.5, 1, [token_id, 11][:n], [-0.5, -1.5][:n])

    async def is_serving(self) -> bool:
        return self.serving

    async def describe(self) -> ModelDescription:
        return DESCRIPTION

    async def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=1, kv_usage=0.25, prefix_cache_queries=40, prefix_cache_hits=16,
                            num_finished={"stop": 3}, num_prefix_deferrals=3)

    async def close(self) -> None:
        pass
