"""An in-memory stand-in for the scheduler client: replies with a fixed text, one token per output.

A continuation (resumed_output_token_ids set) goes on from the reply's token after those it already has, as a
scheduler does: outputs carry only new tokens and num_output_tokens counts the resumed ones too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio

from pagedserve.services.gateway.routing.replica_addresses import Target
from pagedserve.services.gateway.routing.replicas import Health, ReplicaIdentity, ReplicaSet
from pagedserve.services.proto_convert.scheduler_contract import generate_request_to_pb
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput
from pagedserve.shared.scheduler_stats import SchedulerStats
from pagedserve.shared.step_protocol import ModelDescription, TokenLogprobs

EOS = 2
DESCRIPTION = ModelDescription(model_name="tiny-model", architecture="LlamaForCausalLM", max_model_len=256,
                                vocab_size=49152, num_kv_blocks=64, block_size=16, eos_token_ids=(EOS,),
                                dtype="float32", device="cpu", attention_backend="torch", kv_cache_bytes=1)


@dataclass
class FailOnce:
    """Shared by several fakes: the first call (on any of them) to send `after` outputs fails with `error`."""

    after: int
    error: Exception
    fired: bool = False


class FakeSchedulerClient:
    def __init__(self, tokenizer, reply: str = "The capital of France is Paris.", serving: bool = True,
                 instance_id: str = "fake", description: ModelDescription = DESCRIPTION) -> None:
        self.reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [EOS]
        self.serving = serving
        self.fail_after: tuple[int, Exception] | None = None  # (outputs sent, error): the scheduler fails mid-way
        self.fail_once: FailOnce | None = None
        self.handoff_after: int | None = None  # outputs sent, then the request is handed off (draining)
        self.fail_before_output: Exception | None = None  # every call fails with this before any output
        self.hung = False  # health gets no answer and calls produce nothing, until abandoned
        self.num_abandons = 0
        self._hangs: set[asyncio.Event] = set()
        self.address = f"{instance_id}:1"
        self.instance_id = instance_id
        self.description = description
        self.requests: list[GenerateRequest] = []
        self.cancelled: list[str] = []  # req_ids whose stream was closed before it finished

    def connect(self) -> None:
        pass

    async def generate(self, request: GenerateRequest) -> AsyncIterator[RequestOutput]:
        generate_request_to_pb(request)  # what the real client sends: raises where a value does not fit the wire
        self.requests.append(request)
        if self.fail_before_output is not None:
            raise self.fail_before_output
        if self.hung:
            abandoned = asyncio.Event()
            self._hangs.add(abandoned)
            await abandoned.wait()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       "stopped answering")
        finished = False
        resumed = len(request.resumed_output_token_ids)
        assert request.resumed_output_token_ids == self.reply_ids[:resumed], "a continuation of another reply"
        try:
            last = len(self.reply_ids[:request.sampling.max_tokens])
            for sent, n in enumerate(range(resumed + 1, last + 1)):
                token_id = self.reply_ids[n - 1]
                if self.fail_after is not None and sent >= self.fail_after[0]:
                    raise self.fail_after[1]
                if self.fail_once is not None and sent >= self.fail_once.after and not self.fail_once.fired:
                    self.fail_once.fired = True
                    raise self.fail_once.error
                if self.handoff_after is not None and sent >= self.handoff_after:
                    finished = True
                    yield RequestOutput(request.req_id, [], [], FinishReason.HANDOFF, len(request.prompt_token_ids),
                                        0, n - 1)
                    return
                finished = token_id == EOS or n == request.sampling.max_tokens
                reason = None if not finished else FinishReason.STOP if token_id == EOS else FinishReason.LENGTH
                yield RequestOutput(request.req_id, [token_id], [self._logprobs(request, token_id)], reason,
                                    len(request.prompt_token_ids), 0, n,
                                    prompt_logprobs=self.prompt_logprobs(request) if sent == 0 else None)
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

    @staticmethod
    def prompt_logprobs(request: GenerateRequest) -> list[TokenLogprobs] | None:
        """With sampling.prompt_logprobs: token i + 1 of the prompt gets -(i + 1) / 4, ranked 2nd after token 11."""
        n = request.sampling.prompt_logprobs
        if n is None:
            return None
        return [TokenLogprobs(t, -(i + 1) / 4, 2, [11, t][:n], [-0.125, -(i + 1) / 4][:n])
                for i, t in enumerate(request.prompt_token_ids[1:])]

    async def check_health(self) -> Health:
        if self.hung:
            return Health.NO_ANSWER
        return Health.SERVING if self.serving else Health.NOT_SERVING

    def abandon_calls(self) -> None:
        self.num_abandons += 1
        for event in self._hangs:
            event.set()

    async def describe(self) -> ModelDescription:
        return self.description

    async def identify(self) -> ReplicaIdentity:
        return ReplicaIdentity(self.instance_id, publishes_prefix_blocks=False)

    async def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=1, kv_usage=0.25, prefix_cache_queries=40, prefix_cache_hits=16,
                            num_finished={"stop": 3}, num_prefix_deferrals=3)

    async def close(self) -> None:
        pass


def fake_replicas(*fakes: FakeSchedulerClient, health_interval_s: float = 0.02) -> ReplicaSet:
    """A replica set over fake clients, one target each (resolved to itself)."""
    by_address = {fake.address: fake for fake in fakes}
    targets = [Target(fake.instance_id, 1) for fake in fakes]

    async def resolve(target: Target) -> list[str]:
        return [f"{target.host}:{target.port}"]

    return ReplicaSet(targets, by_address.__getitem__, health_interval_s, resolve_interval_s=3600, resolver=resolve)
