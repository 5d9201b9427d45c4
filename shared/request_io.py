"""The gateway -> scheduler contract as domain dataclasses: what a request brings, what flows back per step."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import FailedRequest, TokenLogprobs


class FinishReason(enum.Enum):
    STOP = "stop"  # EOS or a stop token id (stop strings are the gateway's, it aborts on them)
    LENGTH = "length"  # max_tokens or the model's context limit
    ABORT = "abort"  # cancelled by the client or the gateway
    ERROR = "error"  # the worker failed on this request alone (RequestOutput.error says why); never on the wire
    # The replica is draining: the request was stopped at a step boundary with its KV blocks freed and must be resumed
    # elsewhere (prompt + outputs so far as resumed_output_token_ids); never shown to a client.
    HANDOFF = "handoff"


@dataclass
class GenerateRequest:
    req_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str | None = None  # separates prefix-cache entries between tenants
    arrival_time_s: float = field(default_factory=time.time)
    priority: int = 0  # lower is more urgent (vLLM's convention); the gateway bounds it by the tenant's class
    tenant: str = ""  # the tenant's name from the gateway's keys file ("": the one default tenant); steps are shared
    # fairly between tenants
    tenant_weight: float = 1.0  # the tenant's part of the capacity relative to others (> 0)
    # The tenant's soft quota of KV blocks, held + cached, as a fraction of the pool in (0, 1] (None: none): its
    # cached blocks are evicted first and its requests preempted first while it is over
    tenant_kv_cache_share: float | None = None
    # A continuation: tokens this request already produced on another replica (the client has them). The scheduler
    # starts it as if preempted with these as its outputs; max_tokens, min_tokens and the context limit count them;
    # RequestOutput.new_token_ids never re-sends them, num_output_tokens counts them.
    resumed_output_token_ids: list[int] = field(default_factory=list)


@dataclass
class RequestOutput:
    """The delta of one request after one step (new tokens since the last output), and the end when finished."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs | None]
    finish_reason: FinishReason | None  # None while running
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int
    error: FailedRequest | None = None  # set when the request failed (finish reason ERROR): the stream gets an error
    # with SamplingParams.prompt_logprobs, in the output of its first token: one per prompt token after the first
    prompt_logprobs: list[TokenLogprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
