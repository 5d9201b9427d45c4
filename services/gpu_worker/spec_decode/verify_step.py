"""The sampling half of a step that carries draft tokens: plain rows sample as usual, drafted requests verify.

Called by ModelRunner.launch in place of its `_sample` when a request of the step has drafts, before launch()
advances each mirror's `num_computed_tokens` by its scheduled tokens. A drafted request's mirror then takes its
emitted tokens, rolls back the rejected drafts (launch() then leaves it computed up to its last accepted draft; a
draft model's KV likewise) and drops the block ids past what those tokens need: the scheduler applies the same
rule to its block table (DraftPlanner.settle).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.sampler import _gather_logprobs
from pagedserve.services.gpu_worker.sampling_batch import SamplingRow, build_sampling_batch
from pagedserve.services.gpu_worker.spec_decode.rejection_sampler import Verification, verify
from pagedserve.shared.step_protocol import FailedRequest, StepOutput, TokenLogprobs

if TYPE_CHECKING:  # xgrammar loads only once a request brings a grammar
    from pagedserve.services.gpu_worker.grammar_mask import GrammarMask
    from pagedserve.services.gpu_worker.spec_decode.grammar_drafts import DraftWalk

log = logging.getLogger(__name__)
SamplePlain = Callable[[list[RequestState], torch.Tensor], StepOutput]


def verify_step(sampling: list[RequestState], logits: torch.Tensor, sample_plain: SamplePlain, vocab_size: int,
                block_size: int) -> StepOutput:
    """sampling: the step's sampling requests in row order; logits: one row per plain one, 1 + len(drafts) rows
    per drafted one."""
    plain: list[RequestState] = []
    drafted: list[RequestState] = []
    plain_rows: list[int] = []
    drafted_rows: list[int] = []
    row = 0
    for request in sampling:
        num_rows = 1 + len(request.draft_token_ids)
        if num_rows == 1:
            plain.append(request)
            plain_rows.append(row)
        else:
            drafted.append(request)
            drafted_rows.extend(range(row, row + num_rows))
        row += num_rows
    output = sample_plain(plain, logits[plain_rows]) if plain else StepOutput()
    _verify_drafted(drafted, logits[drafted_rows], vocab_size, block_size, output)
    return output


def _verify_drafted(requests: list[RequestState], logits: torch.Tensor, vocab_size: int, block_size: int,
                    output: StepOutput) -> None:
    rows = [SamplingRow(r.sampling, r.prompt_token_ids, r.output_token_ids + r.draft_token_ids[:j], r.stop_token_ids,
                        r.banned_token_ids) for r in requests for j in range(len(r.draft_token_ids) + 1)]
    draft_ids = torch.tensor([t for r in requests for t in [*r.draft_token_ids, -1]], dtype=torch.long,
                             device=logits.device)
    num_drafts = [len(r.draft_token_ids) for r in requests]
    group_of_row = torch.repeat_interleave(torch.arange(len(requests)), torch.tensor(num_drafts) + 1)
    non_finite = (~torch.isfinite(logits.amax(dim=-1))).long().cpu()  # NaN and +inf propagate through amax
    finite = (torch.zeros(len(requests), dtype=torch.long).index_add_(0, group_of_row, non_finite) == 0).tolist()
    walks: list[DraftWalk | None] = [None] * len(requests)
    try:
        batch = build_sampling_batch(rows, vocab_size, logits.device)
        mask, walks = _grammar_walks(requests, rows, vocab_size, logits.device)
        result = verify(logits, batch, draft_ids, num_drafts, mask)
        logprobs = _logprobs(logits, batch, result)
    except Exception:
        log.exception("verifying the drafts of %d requests failed", len(requests))
        result, finite = None, [False] * len(requests)
    for b, request in enumerate(requests):
        start, num_draft = request.num_computed_tokens, len(request.draft_token_ids)
        request.draft_token_ids = []
        if not finite[b] or result is None:
            output.failed.append(FailedRequest(request.req_id, "non-finite logits or verification failed",
                                               invalid_argument=False))
            continue
        tokens, num_accepted = result.token_ids[b], result.num_accepted[b]
        request.token_ids.extend(tokens)
        walk_state = walks[b]
        if walk_state is not None:
            walk_state.settle(tokens)
        request.num_computed_tokens -= num_draft - num_accepted
        # a draft model's KV stays valid only where its inputs were the accepted tokens
        request.draft_num_computed = min(request.draft_num_computed, start + 1 + num_accepted)
        del request.block_ids[-(-(start + 1 + num_accepted) // block_size):]
        output.num_accepted_drafts[request.req_id] = num_accepted
        output.req_ids.extend([request.req_id] * len(tokens))
        output.sampled_token_ids.extend(tokens)
        output.logprobs.extend(logprobs[b])


def _grammar_walks(requests: list[RequestState], rows: list[SamplingRow], vocab_size: int, device: torch.device
                   ) -> tuple[GrammarMask | None, list[DraftWalk | None]]:
    """Per-row grammar masks of the drafted requests (None and no xgrammar import when none has a grammar)."""
    if all(r.grammar is None for r in requests):
        return None, [None] * len(requests)
    from pagedserve.services.gpu_worker.spec_decode.grammar_drafts import walk

    return walk([r.grammar for r in requests], [r.draft_token_ids for r in requests],
                [row.banned_now for row in rows], vocab_size, device)


def _logprobs(logits: torch.Tensor, batch, result: Verification) -> list[list[TokenLogprobs | None]]:
    """Per request, the logprobs of its emitted tokens (from each position's raw distribution) where asked."""
    sizes = [n + 1 for n in result.num_accepted]
    if batch.max_num_logprobs is None:
        return [[None] * size for size in sizes]
    rows = result.emitted_rows.tolist()
    raw = torch.log_softmax(logits[result.emitted_rows.to(logits.device)], dim=-1)
    flat = _gather_logprobs(raw, result.emitted_token_ids, replace(batch, num_logprobs=[
        batch.num_logprobs[r] for r in rows]))
    out, start = [], 0
    for size in sizes:
        out.append(flat[start:start + size])
        start += size
    return out
