"""Per-step token bitmasks of the rows that sample under a grammar; the sampler applies them to the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr

from pagedserve.services.gpu_worker.grammar import RequestGrammar

_BIT = torch.arange(32, dtype=torch.int32)


@dataclass
class GrammarMask:
    bitmask: torch.Tensor  # [S, ceil(V / 32)] int32 on the logits' device; bit j of row i: token j allowed there
    rows: list[int]  # the sampling rows it constrains (the others are all ones and skipped)

    def apply(self, logits: torch.Tensor) -> None:
        """-inf on every token a row's grammar does not allow, in place."""
        xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=logits.shape[-1], indices=self.rows)


def build_grammar_mask(grammars: list[RequestGrammar | None], banned: list[tuple[int, ...]], vocab_size: int,
                       device: torch.device) -> GrammarMask | None:
    """The allowed tokens of each constrained row (`grammars` and `banned` are parallel to the sampling rows).

    A grammar that can only end while the request may not (its stop tokens are banned: ignore_eos, or fewer than
    min_tokens outputs) has done its job: the row samples unconstrained from then on, as vLLM's requests run on
    after their grammar terminated."""
    rows = [i for i, grammar in enumerate(grammars) if grammar is not None and grammar.constrains]
    if not rows:
        return None
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
    for i in rows:
        matcher = grammars[i].matcher
        matcher.fill_next_token_bitmask(bitmask, i)
        if banned[i] and matcher.is_completed() and not allows_any(bitmask[i], banned[i], vocab_size):
            grammars[i].ended = True
            bitmask[i] = -1
    rows = [i for i in rows if grammars[i].constrains]
    return GrammarMask(bitmask.to(device, non_blocking=True), rows) if rows else None


def allows_any(row: torch.Tensor, banned: tuple[int, ...], vocab_size: int) -> bool:
    """Whether a bitmask row allows a token outside `banned` (rare path: only where a grammar can end)."""
    allowed = ((row[:, None] >> _BIT) & 1).flatten()[:vocab_size].bool()
    allowed[list(banned)] = False
    return bool(allowed.any())
