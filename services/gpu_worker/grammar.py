"""Grammar-constrained decoding on the worker: one xgrammar matcher per request, over grammars compiled by
shared/grammar_cache.py (the scheduler admits a constrained request only once PrepareGrammar has answered, so its
first step finds the grammar compiled).

A request's matcher lives in its mirror: created with the mirror (replaying the outputs of a preempted request, so
recompute continues from the same grammar state), advanced by every token the worker samples for it, and dropped
with the mirror when the request finishes or is preempted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import xgrammar as xgr

log = logging.getLogger(__name__)


@dataclass
class RequestGrammar:
    """One request's position in its grammar."""

    matcher: xgr.GrammarMatcher
    ended: bool = False  # the grammar is done and the request goes on (ignore_eos, min_tokens): no more masking

    @classmethod
    def start(cls, compiled: xgr.CompiledGrammar, output_token_ids: list[int]) -> RequestGrammar:
        """A matcher at the request's current position: the outputs it already has (after a preemption) are
        replayed, so the recompute continues exactly where the request was."""
        grammar = cls(xgr.GrammarMatcher(compiled))
        for token_id in output_token_ids:
            grammar.advance(token_id)
        return grammar

    @property
    def constrains(self) -> bool:
        return not self.ended and not self.matcher.is_terminated()

    def advance(self, token_id: int) -> None:
        """Feed a sampled token. A token the grammar refuses can only come after the grammar ended."""
        if self.constrains and not self.matcher.accept_token(token_id):
            log.warning("the grammar refused token %d; the rest of the output is unconstrained", token_id)
            self.ended = True
