"""The worker's mirror of one live request: enough to compute its next tokens without resending its context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.sampling_params import SamplingParams

if TYPE_CHECKING:
    from services.gpu_worker.grammar import RequestGrammar


@dataclass
class RequestState:
    req_id: str
    token_ids: list[int]  # prompt, then every sampled token (the worker appends its own samples)
    num_prompt_tokens: int
    sampling: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int  # tokens whose KV is in the cache
    stop_token_ids: tuple[int, ...]  # banned by the sampler until min_tokens outputs exist
    banned_token_ids: tuple[int, ...] = ()  # never sampled: the model's EOS ids under ignore_eos
    grammar: RequestGrammar | None = None  # the request's structured-output matcher, advanced by each sample
    # this step's draft tokens (speculative decoding): computed after token_ids, verified, then cleared
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
