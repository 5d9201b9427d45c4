"""Prompt logprobs (SamplingParams.prompt_logprobs): the logprob of each prompt token after the first, and the top-N
at its position, from the rows of the prompt chunks a step computes.

The row of prompt position p predicts token p + 1, so a chunk over positions [s, s + n) of a prompt of P tokens
gives the entries of tokens s + 1 .. min(s + n, P - 1) (the row of position P - 1 samples the first output token).
The entries accumulate on the request's mirror chunk by chunk and leave the worker in the step that samples its
first token after the whole prompt (StepOutput.prompt_logprobs). Every prompt position must be computed here, so
the scheduler never serves such a request from the prefix cache.

Memory: the rows' logits are made `SLICE_ROWS` at a time, log-softmaxed and reduced to the target's logprob and
rank plus the top-N on the device; only those leave it, never a vocabulary-wide row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.step_rows import StepRows
from pagedserve.shared.step_protocol import TokenLogprobs

SLICE_ROWS = 256  # logits rows alive at once: 256 x a 150k vocabulary in fp32 is ~150 MiB


@dataclass
class PromptRows:
    """A step's prompt-logprob rows: their indices in the step, the prompt tokens they predict, and whose."""

    rows: list[int]  # indices into the step's flattened rows, increasing
    targets: list[int]  # the prompt token each row predicts
    owners: list[tuple[RequestState, int]]  # (request, its number of rows), in row order
    num_decodes: int  # of `rows`, those in the step's decode region (a one-token chunk)


def plan_prompt_rows(requests: list[RequestState], starts: list[int], num_scheduled: list[int],
                     first_rows: list[int], num_decode_rows: int) -> PromptRows | None:
    """The rows of the requests asking for prompt logprobs that predict a prompt token; None when there are none.
    `first_rows[i]`: the step row of request i's first scheduled token."""
    rows: list[int] = []
    targets: list[int] = []
    owners: list[tuple[RequestState, int]] = []
    for request, start, n, first in zip(requests, starts, num_scheduled, first_rows, strict=True):
        if request.sampling.prompt_logprobs is None:
            continue
        end = min(start + n, request.num_prompt_tokens - 1)
        if end <= start:
            continue
        rows.extend(range(first, first + end - start))
        targets.extend(request.token_ids[start + 1: end + 1])
        owners.append((request, end - start))
    if not rows:
        return None
    return PromptRows(rows, targets, owners, sum(1 for r in rows if r < num_decode_rows))


def gather_prompt_logprobs(hidden: torch.Tensor, prompt: PromptRows,
                           compute_logits: Callable[[torch.Tensor, StepRows], torch.Tensor | None]) -> None:
    """hidden: the final hidden states of `prompt.rows`, in order. Appends each row's entry to its request's
    `prompt_logprobs` (nothing where compute_logits gives None: a tensor-parallel rank other than the leader)."""
    targets = torch.tensor(prompt.targets, dtype=torch.long, device=hidden.device)
    top_n = max(request.sampling.prompt_logprobs for request, _ in prompt.owners)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for lo in range(0, len(prompt.rows), SLICE_ROWS):
        hi = min(lo + SLICE_ROWS, len(prompt.rows))
        num_decodes = max(0, min(prompt.num_decodes, hi) - lo)
        logits = compute_logits(hidden[lo:hi], StepRows(hi - lo, num_decodes))
        if logits is None:
            return
        parts.append(_reduce(torch.log_softmax(logits, dim=-1), targets[lo:hi], top_n))
    chosen, ranks, top_values, top_ids = (torch.cat(column).tolist() for column in zip(*parts, strict=True))
    row = 0
    for request, count in prompt.owners:
        n = request.sampling.prompt_logprobs
        request.prompt_logprobs.extend(
            TokenLogprobs(token_id=prompt.targets[i], logprob=chosen[i], rank=ranks[i],
                          top_token_ids=top_ids[i][:n], top_logprobs=top_values[i][:n])
            for i in range(row, row + count))
        row += count


def _reduce(logprobs: torch.Tensor, targets: torch.Tensor, top_n: int
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[R, V] logprobs -> the targets' logprobs [R], their 1-based ranks [R], the top-N values and ids [R, N]."""
    chosen = logprobs.gather(-1, targets[:, None]).squeeze(-1)
    ranks = (logprobs > chosen[:, None]).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(top_n, dim=-1)
    return chosen, ranks, top_values, top_ids
