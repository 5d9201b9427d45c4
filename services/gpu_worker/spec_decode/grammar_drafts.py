"""Grammar masks for draft verification, and the matcher rollback after it.

A drafted request under a grammar verifies 1 + k rows; row j must be masked with the grammar's state after the
request's outputs plus drafts 0..j-1, exactly the mask the plain step for that position would use. `walk` builds
those masks by feeding the drafts to the request's matcher one by one (filling row j's mask before feeding draft j)
and stops where the grammar refuses a draft: that draft is masked out on its own row, so it is rejected and no
row after it is emitted (those rows stay unmasked). `DraftWalk.settle` then rolls the matcher back over every
draft it took and replays the tokens the request actually emitted, so the matcher ends where the plain steps
would have left it.
xgrammar's matchers roll back without limit (0.2.x), so k needs no setting at matcher creation.

`RequestGrammar.ended` (the grammar is done, the request runs on unconstrained) is part of the state: a row that
ends the grammar (it can only stop while its stop tokens are banned) is recorded, and `settle` ends it again only
when the emitted tokens reach that row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import xgrammar as xgr

from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.services.gpu_worker.grammar_mask import GrammarMask, allows_any


@dataclass
class DraftWalk:
    """What walking one request's drafts did to its grammar, to undo in `settle`."""

    grammar: RequestGrammar
    ended_before: bool
    num_fed: int  # drafts the matcher accepted (to roll back)
    ends_at: int | None  # the row (within the request) whose mask ended the grammar, if one did

    def settle(self, emitted: list[int]) -> None:
        """Undo the walk, then advance the matcher by the request's emitted tokens as the plain steps would."""
        grammar = self.grammar
        if self.num_fed:
            grammar.matcher.rollback(self.num_fed)
        grammar.ended = self.ended_before
        for j, token_id in enumerate(emitted):
            if j == self.ends_at:
                grammar.ended = True
            grammar.advance(token_id)


def walk(grammars: list[RequestGrammar | None], drafts: list[list[int]], banned: list[tuple[int, ...]],
         vocab_size: int, device: torch.device) -> tuple[GrammarMask | None, list[DraftWalk | None]]:
    """Masks for the verification rows of the drafted requests (`grammars` and `drafts` per request, `banned` per
    row: the request's 1 + len(drafts) rows in turn), and per request what to undo once its tokens are known."""
    num_rows = sum(1 + len(d) for d in drafts)
    bitmask = xgr.allocate_token_bitmask(num_rows, vocab_size)
    rows: list[int] = []
    walks: list[DraftWalk | None] = []
    base = 0
    for grammar, request_drafts in zip(grammars, drafts, strict=True):
        walks.append(None if grammar is None else
                     _walk_one(grammar, request_drafts, banned[base:], bitmask, base, rows, vocab_size))
        base += 1 + len(request_drafts)
    return (GrammarMask(bitmask.to(device, non_blocking=True), rows) if rows else None), walks


def _walk_one(grammar: RequestGrammar, drafts: list[int], banned: list[tuple[int, ...]], bitmask: torch.Tensor,
              base: int, rows: list[int], vocab_size: int) -> DraftWalk:
    state = DraftWalk(grammar, grammar.ended, 0, None)
    for j in range(len(drafts) + 1):
        if not grammar.constrains:
            break  # ended or terminated: the plain step would not mask either
        matcher = grammar.matcher
        matcher.fill_next_token_bitmask(bitmask, base + j)
        if banned[j] and matcher.is_completed() and not allows_any(bitmask[base + j], banned[j], vocab_size):
            grammar.ended, state.ends_at = True, j
            bitmask[base + j] = -1
            break
        rows.append(base + j)
        if j == len(drafts) or not matcher.accept_token(drafts[j]):
            break  # a refused draft is masked out on its own row: rejected, nothing after it is emitted
        state.num_fed += 1
    return state
