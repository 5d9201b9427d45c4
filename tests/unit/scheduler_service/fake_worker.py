"""A worker stand-in for the engine loop: mirrors requests like the real one and samples a fixed token."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from shared.step_protocol import ModelDescription, StepInput, StepOutput

SAMPLED_TOKEN = 7
DESCRIPTION = ModelDescription(model_name="fake", architecture="LlamaForCausalLM", max_model_len=256, vocab_size=100,
                                num_kv_blocks=32, block_size=4, eos_token_ids=(2,), dtype="float32", device="cpu",
                                attention_backend="torch", kv_cache_bytes=1)


class FakeWorkerClient:
    address = "fake-worker"

    def __init__(self, step_delay_s: float = 0.0) -> None:
        self.step_delay_s = step_delay_s
        self.mirrors: dict[str, list[int]] = {}  # req_id -> [num known tokens, num computed tokens]
        self.steps: list[StepInput] = []
        self.fail_next_step = False
        self.num_describes = 0

    async def wait_until_ready(self) -> ModelDescription:
        self.num_describes += 1
        return DESCRIPTION

    async def step(self, step: StepInput, step_id: int, traceparents: dict[str, str]) -> StepOutput:
        self.steps.append(step)
        await asyncio.sleep(self.step_delay_s)
        if self.fail_next_step:
            self.fail_next_step = False
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "connection refused")
        for req_id in step.finished_req_ids:
            self.mirrors.pop(req_id, None)
        for new in step.new_requests:
            self.mirrors[new.req_id] = [len(new.token_ids), new.num_computed_tokens]
        output = StepOutput()
        for req_id, num in step.num_scheduled_tokens.items():
            mirror = self.mirrors[req_id]
            mirror[1] += num
            if mirror[1] == mirror[0]:
                mirror[0] += 1
                output.req_ids.append(req_id)
                output.sampled_token_ids.append(SAMPLED_TOKEN)
                output.logprobs.append(None)
        return output
