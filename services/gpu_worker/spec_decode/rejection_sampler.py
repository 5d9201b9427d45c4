"""Verify draft tokens against the target model's distributions at their positions.

Rows come in groups, one per request: a row per draft token (its position's target distribution and the draft
token to check) followed by one bonus row (the distribution after the last draft). Every row is sampled exactly as
the plain sampler samples it (penalties and bias, the grammar mask, then greedy or the exponential race with the
row's generator), and a draft is accepted when it equals its row's sample. For a greedy row that is the argmax
rule. For a random row it is the standard accept-with-min(1, p/q) rule for a point-mass proposal q (n-gram): the
draft d is accepted with probability p(d), and on rejection the emitted token (the row's sample, never d) is
distributed as p with d removed, renormalised; so emitted tokens follow p position by position. Coupling the
acceptance to the plain sampler's draw makes a seeded request's tokens the ones it gets without speculation: row j
of a request with i outputs draws from the generator of (seed, i + j), as the plain step for output i + j does.
A request emits its accepted drafts and one more token: the first rejected position's sample, or the bonus row's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.sampler import _apply_bias_and_penalties, _sample_random
from pagedserve.services.gpu_worker.sampling_batch import SamplingBatch

if TYPE_CHECKING:  # xgrammar loads only once a request brings a grammar
    from pagedserve.services.gpu_worker.grammar_mask import GrammarMask


@dataclass
class Verification:
    num_accepted: list[int]  # per request
    token_ids: list[list[int]]  # per request: its accepted drafts then one more token
    emitted_rows: torch.Tensor  # [sum(num_accepted) + num_requests] the rows whose tokens are emitted, in order
    emitted_token_ids: torch.Tensor  # parallel to emitted_rows


def verify(logits: torch.Tensor, batch: SamplingBatch, draft_ids: torch.Tensor, num_drafts: list[int],
           grammar_mask: GrammarMask | None = None) -> Verification:
    """logits [R, V] fp32 and draft_ids [R] (the draft token each row checks, -1 on bonus rows), grouped as
    num_drafts[b] + 1 rows per request b. `grammar_mask`: per-row masks (each row's grammar state after the drafts
    before it), applied after penalties and bias as the plain sampler does; `logits` is not modified."""
    logits = _apply_bias_and_penalties(logits, batch)
    if grammar_mask is not None:
        logits = logits.clone() if batch.penalties is None and batch.bias_index is None else logits
        grammar_mask.apply(logits)
    greedy_ids = logits.argmax(dim=-1)
    row_tokens = greedy_ids if batch.all_greedy else torch.where(
        batch.temperature == 0.0, greedy_ids, _sample_random(logits, batch))
    accepted = (draft_ids >= 0) & (row_tokens == draft_ids)
    return _emitted(accepted, row_tokens, num_drafts)


def _emitted(accepted: torch.Tensor, row_tokens: torch.Tensor, num_drafts: list[int]) -> Verification:
    """Each group's rows up to and including its first non-accepted row (bonus rows are never accepted)."""
    counts = torch.tensor(num_drafts, dtype=torch.long) + 1
    rejected = (~accepted).long().cpu()
    rejected_before = torch.cumsum(rejected, 0) - rejected  # rejections on earlier rows, all groups
    group_start = torch.cumsum(counts, 0) - counts
    within = rejected_before - torch.repeat_interleave(rejected_before[group_start], counts)
    emit = within == 0
    emitted_rows = torch.nonzero(emit).squeeze(-1)
    group_of_row = torch.repeat_interleave(torch.arange(len(num_drafts)), counts)
    num_emitted = torch.zeros(len(num_drafts), dtype=torch.long).index_add_(0, group_of_row, emit.long())
    emitted_token_ids = row_tokens[emitted_rows.to(row_tokens.device)]
    tokens = emitted_token_ids.tolist()
    sizes = num_emitted.tolist()
    splits, start = [], 0
    for size in sizes:
        splits.append(tokens[start:start + size])
        start += size
    return Verification([size - 1 for size in sizes], splits, emitted_rows, emitted_token_ids)
