"""Batched sampling: penalties and bias, then greedy or temperature / top-k / top-p / min-p sampling."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.sampling_batch import Penalties, SamplingBatch
from pagedserve.shared.step_protocol import TokenLogprobs

if TYPE_CHECKING:  # xgrammar loads only once a request brings a grammar
    from pagedserve.services.gpu_worker.grammar_mask import GrammarMask


def sample(logits: torch.Tensor, batch: SamplingBatch, grammar_mask: GrammarMask | None = None
           ) -> tuple[torch.Tensor, list[TokenLogprobs | None]]:
    """logits [S, V] fp32 -> sampled token ids [S] and, per row, logprobs when asked (from the raw logits).

    The grammar mask, when given, is applied last (after penalties and bias), in place on `logits`."""
    raw_logprobs = torch.log_softmax(logits, dim=-1) if batch.max_num_logprobs is not None else None
    logits = _apply_bias_and_penalties(logits, batch)
    if grammar_mask is not None:
        grammar_mask.apply(logits)
    greedy_ids = logits.argmax(dim=-1)
    sampled = greedy_ids if batch.all_greedy else torch.where(
        batch.temperature == 0.0, greedy_ids, _sample_random(logits, batch))
    logprobs = _gather_logprobs(raw_logprobs, sampled, batch) if raw_logprobs is not None else [None] * len(sampled)
    return sampled, logprobs


def _apply_bias_and_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    if batch.penalties is None and batch.bias_index is None:
        return logits
    logits = logits.clone()
    if batch.penalties is not None:
        _apply_penalties(logits, batch.penalties)
    if batch.bias_index is not None:
        logits.index_put_(batch.bias_index, batch.bias_values, accumulate=True)
    return logits


def _apply_penalties(logits: torch.Tensor, p: Penalties) -> None:
    """Repetition (divide positive / multiply negative logits of seen tokens), then presence and frequency."""
    repetition = p.repetition[:, None].expand_as(logits)
    penalised = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits.copy_(torch.where(p.seen_mask, penalised, logits))
    logits -= p.frequency[:, None] * p.output_counts
    logits -= p.presence[:, None] * (p.output_counts > 0).float()


def filtered_probs(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Each random row's distribution after temperature, top-k/p and min-p, not renormalised after min-p."""
    temperature = torch.where(batch.temperature == 0.0, torch.ones_like(batch.temperature), batch.temperature)
    logits = logits / temperature[:, None]
    if batch.top_k is not None or batch.top_p is not None:
        logits = _top_k_top_p(logits, batch.top_k, batch.top_p)
    probs = torch.softmax(logits, dim=-1)
    if batch.min_p is not None:
        max_prob = probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < batch.min_p[:, None] * max_prob, 0.0)
    return probs


def _sample_random(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    return _exponential_race(filtered_probs(logits, batch), batch.generators)


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)
    if top_k is not None:
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    if top_p is not None:
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # the most likely token always stays (mass_before = 0)
        sorted_logits = sorted_logits.masked_fill(mass_before > top_p[:, None], float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _exponential_race(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """argmax(p / E) with E ~ Exp(1) draws from p; seeded rows take E from their own generator."""
    noise = torch.empty_like(probs).exponential_()
    for i, generator in enumerate(generators):
        if generator is not None:
            noise[i].exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def _gather_logprobs(raw: torch.Tensor, sampled: torch.Tensor, batch: SamplingBatch) -> list[TokenLogprobs | None]:
    chosen = raw.gather(-1, sampled[:, None]).squeeze(-1)
    ranks = (raw > chosen[:, None]).sum(dim=-1) + 1
    top_values, top_ids = raw.topk(batch.max_num_logprobs, dim=-1) if batch.max_num_logprobs else (None, None)
    out: list[TokenLogprobs | None] = []
    for i, n in enumerate(batch.num_logprobs):
        if n is None:
            out.append(None)
            continue
        out.append(TokenLogprobs(
            token_id=int(sampled[i]), logprob=float(chosen[i]), rank=int(ranks[i]),
            top_token_ids=top_ids[i, :n].tolist() if n else [],
            top_logprobs=top_values[i, :n].tolist() if n else []))
    return out
