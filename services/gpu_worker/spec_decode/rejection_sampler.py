"""Verify draft tokens against the target model's distributions at their positions.

Rows come in groups, one per request: a row per draft token (its position's target distribution and the draft
token to check) followed by one bonus row (the distribution after the last draft). For a greedy row a draft is
accepted when it is the argmax. For a random row the draft proposal is a point mass (n-gram), so the standard rule
accept-with-min(1, p/q) becomes: accept draft d with probability p(d); on rejection sample from p with d's mass
removed, renormalised. The emitted tokens are then distributed exactly as p, position by position. A request emits
its accepted drafts and one more token: the first rejected position's replacement, or the bonus row's sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.sampler import _apply_bias_and_penalties, _exponential_race, filtered_probs
from pagedserve.services.gpu_worker.sampling_batch import SamplingBatch


@dataclass
class Verification:
    num_accepted: list[int]  # per request
    token_ids: list[list[int]]  # per request: its accepted drafts then one more token
    emitted_rows: torch.Tensor  # [sum(num_accepted) + num_requests] the rows whose tokens are emitted, in order
    emitted_token_ids: torch.Tensor  # parallel to emitted_rows


def target_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """The distribution `sample` draws from for each random row (after penalties and bias), normalised."""
    probs = filtered_probs(logits, batch)
    return probs / probs.sum(dim=-1, keepdim=True)


def _uniform(num_rows: int, generators: list[torch.Generator | None], device: torch.device) -> torch.Tensor:
    uniform = torch.rand(num_rows, device=device)
    for i, generator in enumerate(generators):
        if generator is not None:
            uniform[i] = torch.rand(1, generator=generator, device=device)[0]
    return uniform


def verify(logits: torch.Tensor, batch: SamplingBatch, draft_ids: torch.Tensor, num_drafts: list[int]
           ) -> Verification:
    """logits [R, V] fp32 and draft_ids [R] (the draft token each row checks, -1 on bonus rows), grouped as
    num_drafts[b] + 1 rows per request b."""
    logits = _apply_bias_and_penalties(logits, batch)
    is_draft = draft_ids >= 0
    drafts = draft_ids.clamp(min=0)
    greedy_ids = logits.argmax(dim=-1)
    if batch.all_greedy:
        accepted = is_draft & (greedy_ids == draft_ids)
        row_tokens = greedy_ids
    else:
        probs = target_probs(logits, batch)
        accept_random = _uniform(len(draft_ids), batch.generators, logits.device) < probs.gather(
            -1, drafts[:, None]).squeeze(-1)
        residual = torch.where(is_draft[:, None], probs.scatter(-1, drafts[:, None], 0.0), probs)
        greedy_rows = batch.temperature == 0.0
        accepted = is_draft & torch.where(greedy_rows, greedy_ids == draft_ids, accept_random)
        row_tokens = torch.where(greedy_rows, greedy_ids, _exponential_race(residual, batch.generators))
    row_tokens = torch.where(accepted, draft_ids, row_tokens)
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
