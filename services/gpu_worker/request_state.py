"""The worker's mirror of one live request: enough to compute its next tokens without resending its context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import TokenLogprobs

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.grammar import RequestGrammar


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
    # (step serial, row) of a token sampled on the device whose host copy is not back yet: it belongs at
    # token_ids[len(token_ids)], and a step that computes it takes it from that step's sampled ids by index
    pending: tuple[int, int] | None = None
    dropped: bool = False  # failed in the worker: outputs of steps still in flight for it are not reported
    # this step's draft tokens (speculative decoding): computed after token_ids, verified, then cleared
    draft_token_ids: list[int] = field(default_factory=list)
    # draft model: positions [0, draft_num_computed) hold valid keys and values in the draft model's KV cache
    # (spec_decode/draft_model.py); never more than num_computed_tokens once a step is verified
    draft_num_computed: int = 0
    # with sampling.prompt_logprobs: the entries of the prompt chunks computed so far (prompt_logprobs.py), sent
    # with the first token sampled after the whole prompt (then prompt_logprobs_sent)
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs_sent: bool = False

    @property
    def num_tokens(self) -> int:
        """Known tokens, the one still on the device included."""
        return len(self.token_ids) + (self.pending is not None)

    def fed_row(self, step: int) -> int:
        """The row of `step`'s sampled ids holding this request's device-only token."""
        if self.pending is None or self.pending[0] != step:
            raise RuntimeError(f"request {self.req_id}: its token is pending from step {self.pending}, not {step}")
        return self.pending[1]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
