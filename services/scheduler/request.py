"""The scheduler's view of one request: its tokens, progress and status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again, its blocks taken back; resumes by recomputing
    FINISHED = "finished"


@dataclass
class Request:
    req_id: str
    token_ids: list[int]  # prompt followed by outputs
    num_prompt_tokens: int
    sampling: SamplingParams
    cache_salt: str | None
    arrival_time_s: float
    status: RequestStatus = RequestStatus.WAITING
    # tokens whose KV is in the cache or being computed by a step already sent; catches up with num_tokens_ahead
    num_computed_tokens: int = 0
    # tokens the worker samples in steps already sent whose outputs have not come back (async scheduling): they
    # are not in token_ids yet, but the worker mirrors them and the next step may compute them
    num_placeholders: int = 0
    num_drafts_in_flight: int = 0  # draft tokens of its step in flight: not scheduled again until they are settled
    num_cached_tokens: int | None = None  # prompt tokens served by the prefix cache at first admission
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    on_worker: bool = False  # the worker holds a mirror of this request
    num_blocks_on_worker: int = 0  # block ids already sent to the worker
    num_outputs_reported: int = 0  # output tokens already handed out in a RequestOutput
    block_hashes: list[bytes] = field(default_factory=list)  # prefix-cache keys of this request's full blocks
    priority: int = 0  # lower is more urgent (vLLM's convention): orders the queue, picks preemption victims
    tenant: str = ""  # whose request it is: the queue shares steps between tenants by their recent service
    tenant_weight: float = 1.0  # the tenant's part of the capacity relative to other tenants (> 0)
    prompt_logprobs_reported: bool = False  # sampling.prompt_logprobs went out (a recomputation's copy is dropped)
    kv_cache_share: float | None = None  # the tenant's quota of KV blocks (held + cached) as a pool fraction

    @classmethod
    def from_generate(cls, request: GenerateRequest) -> Request:
        """A resumed request (outputs produced on another replica) starts as if preempted with those outputs: its KV
        is recomputed from prompt + outputs, the worker's mirror replays them (grammar, seeded sampler position),
        stop conditions count them, and they are never reported again."""
        resumed = request.resumed_output_token_ids
        return cls(request.req_id, [*request.prompt_token_ids, *resumed], len(request.prompt_token_ids),
                   request.sampling, request.cache_salt, request.arrival_time_s,
                   status=RequestStatus.PREEMPTED if resumed else RequestStatus.WAITING,
                   num_outputs_reported=len(resumed), priority=request.priority, tenant=request.tenant,
                   tenant_weight=request.tenant_weight, kv_cache_share=request.tenant_kv_cache_share)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens_ahead(self) -> int:
        """Known tokens plus those the worker samples in steps in flight: what the next step may compute up to."""
        return len(self.token_ids) + self.num_placeholders

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
