"""What the worker checks about a request before it touches the KV cache: a bad one fails alone, never its step.

A parameter the client chose (a token id past the vocabulary) is `invalid_argument`; a block id past the pool or a
mirror the worker does not hold is the scheduler's mistake and fails the request as an internal error.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.shared.step_protocol import CachedRequest, FailedRequest, NewRequest


@dataclass(frozen=True)
class WorkerLimits:
    vocab_size: int
    num_kv_blocks: int
    max_model_len: int


def _first_out_of_range(values, size: int) -> int | None:
    return next((v for v in values if not 0 <= v < size), None)


def check_new_request(new: NewRequest, limits: WorkerLimits) -> FailedRequest | None:
    for param, token_ids in (("prompt", new.token_ids), ("logit_bias", new.sampling.logit_bias),
                             ("stop_token_ids", new.sampling.stop_token_ids)):
        bad = _first_out_of_range(token_ids, limits.vocab_size)
        if bad is not None:
            return FailedRequest(new.req_id, f"{param}: token id {bad} is out of the vocabulary "
                                             f"(size {limits.vocab_size})", invalid_argument=True)
    if len(new.token_ids) > limits.max_model_len:
        return FailedRequest(new.req_id, f"{len(new.token_ids)} tokens exceed the context limit "
                                         f"{limits.max_model_len}", invalid_argument=True)
    if not 0 <= new.num_computed_tokens < len(new.token_ids) or new.num_prompt_tokens > len(new.token_ids):
        return FailedRequest(new.req_id, f"inconsistent request: {new.num_computed_tokens} computed and "
                                         f"{new.num_prompt_tokens} prompt tokens of {len(new.token_ids)}",
                             invalid_argument=False)
    if new.sampling.prompt_logprobs is not None and new.num_computed_tokens:
        return FailedRequest(new.req_id, f"prompt logprobs need every prompt position computed here, but "
                                         f"{new.num_computed_tokens} tokens came from the prefix cache",
                             invalid_argument=False)
    return check_block_ids(new.req_id, new.block_ids, limits)


def check_block_ids(req_id: str, block_ids: list[int], limits: WorkerLimits) -> FailedRequest | None:
    bad = _first_out_of_range(block_ids, limits.num_kv_blocks)
    if bad is None:
        return None
    return FailedRequest(req_id, f"block id {bad} is outside the KV pool ({limits.num_kv_blocks} blocks)",
                         invalid_argument=False)


def check_cached_request(cached: CachedRequest, num_computed_tokens: int | None,
                         limits: WorkerLimits) -> FailedRequest | None:
    """`num_computed_tokens` is the worker's mirror's (None when it holds no mirror)."""
    if num_computed_tokens is None:
        return FailedRequest(cached.req_id, "sent as cached but unknown to the worker", invalid_argument=False)
    if num_computed_tokens != cached.num_computed_tokens:
        return FailedRequest(cached.req_id, f"the worker computed {num_computed_tokens} tokens, the scheduler says "
                                            f"{cached.num_computed_tokens}", invalid_argument=False)
    return check_block_ids(cached.req_id, cached.new_block_ids, limits)
