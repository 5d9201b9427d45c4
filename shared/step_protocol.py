"""The scheduler -> worker step contract as domain dataclasses (proto messages stop at the servicers).

One call per engine step. A request the worker sees for the first time arrives as `NewRequest` with everything
it needs; afterwards it arrives as `CachedRequest` carrying only what changed. The worker keeps a mirror of each
live request and appends the tokens it samples, so a step's payload grows with the step, not with the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.shared.sampling_params import SamplingParams


@dataclass
class NewRequest:
    """First appearance of a request on the worker (or reappearance after preemption)."""

    req_id: str
    token_ids: list[int]  # prompt + any output generated before a preemption; the worker computes a slice of it
    num_prompt_tokens: int  # token_ids[num_prompt_tokens:] are outputs (they count for penalties)
    sampling: SamplingParams
    block_ids: list[int]  # physical KV blocks of this request, in logical order
    num_computed_tokens: int  # tokens whose KV is already in the cache (prefix-cache hit); compute starts here


@dataclass
class CachedRequest:
    """A request the worker already mirrors: only newly appended blocks travel."""

    req_id: str
    new_block_ids: list[int]
    num_computed_tokens: int  # the scheduler's view, checked against the worker's mirror


@dataclass
class StepInput:
    new_requests: list[NewRequest] = field(default_factory=list)
    cached_requests: list[CachedRequest] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # req_id -> tokens computed this step
    finished_req_ids: list[str] = field(default_factory=list)  # finished, aborted or preempted: drop the mirror
    incarnation_id: str = ""  # the worker incarnation the block ids belong to; another one applies nothing
    # speculative decoding: req_id -> draft tokens appended after its last known token; such a request is
    # scheduled for 1 + len(drafts) tokens and its output holds 1 + (accepted drafts) tokens
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # speculative decoding with a draft model: req_id -> draft positions the worker's draft model proposes after
    # the request's last known token (scheduled for 1 + that many tokens, as with draft_token_ids)
    draft_model_slots: dict[str, int] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass
class TokenLogprobs:
    """Logprob of the sampled token plus the top-N alternatives, from the model's raw distribution."""

    token_id: int
    logprob: float
    rank: int  # 1-based rank of the sampled token in the raw distribution
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True)
class FailedRequest:
    """A request the worker dropped on its own error; the rest of its step went on."""

    req_id: str
    message: str
    invalid_argument: bool  # its parameters were wrong (the client's fault); False: the worker failed on it


@dataclass
class StepOutput:
    """Sampled tokens for the requests that reached the end of their known tokens this step. A request that
    carried drafts appears once per token it produced (accepted drafts, then one sampled token), consecutively."""

    req_ids: list[str] = field(default_factory=list)
    sampled_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # parallel to req_ids
    forward_time_ns: int = 0  # time spent in the forward pass and sampling, for stats and tracing
    sample_time_ns: int = 0  # of forward_time_ns, the sampler's
    idle_time_ns: int = 0  # the worker's wait for this step since it finished its previous one (set by its server)
    incarnation_id: str = ""  # the worker's; another than the step's means it restarted and applied nothing
    failed: list[FailedRequest] = field(default_factory=list)  # dropped requests, none of them in req_ids
    num_accepted_drafts: dict[str, int] = field(default_factory=dict)  # req_id -> its drafts accepted, if it had any
    # req_id -> its prompt logprobs (SamplingParams.prompt_logprobs), one per prompt token after the first, in the
    # step that samples its first token after computing the whole prompt; token_id is the prompt's own token
    prompt_logprobs: dict[str, list[TokenLogprobs]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelDescription:
    """What the worker tells the scheduler at start-up: model facts and the KV pool it allocated."""

    model_name: str
    architecture: str
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...]
    dtype: str
    device: str
    attention_backend: str
    kv_cache_bytes: int
    incarnation_id: str = ""  # new on every worker start (the KV pool starts empty)

    @property
    def num_kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    def pool_problem(self) -> str | None:
        """Why one request of the full context would not fit the KV pool (then every long request would be refused
        after the server said it was ready); None when it fits."""
        if self.num_kv_tokens >= self.max_model_len:
            return None
        num_blocks = -(-self.max_model_len // self.block_size)
        need_bytes = -(-self.kv_cache_bytes * num_blocks // max(1, self.num_kv_blocks))
        return (f"the KV cache ({self.kv_cache_bytes / 2**20:.0f} MiB) holds {self.num_kv_tokens} tokens, fewer than "
                f"the context limit of {self.max_model_len}: give it at least {need_bytes / 2**20:.0f} MiB "
                f"(--kv-cache-memory-bytes on CPU, --gpu-memory-utilization on a GPU) or lower --max-model-len")
