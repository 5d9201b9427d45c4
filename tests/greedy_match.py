"""vLLM's closeness rule for greedy outputs produced under different batch shapes or implementations."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MatchResult:
    exact: bool
    first_difference: int | None  # index of the first differing token, when not exact

    def describe(self) -> str:
        return "exact" if self.exact else f"near-tie flip at token {self.first_difference}"


def check_greedy_match(tokens_a: list[int], top_a: list[list[int]], tokens_b: list[int],
                       top_b: list[list[int]]) -> MatchResult:
    """Token for token; or, from the first difference on, each side's token is in the other's top-N there.

    After the first difference the sequences diverge, so nothing later is compared (as in vLLM's check): their
    lengths may differ then (an EOS on one side of a near tie ends that answer). Without a difference they must be
    the same length."""
    for i, (a, b) in enumerate(zip(tokens_a, tokens_b, strict=False)):
        if a != b:
            assert a in top_b[i], f"token {i}: {a} not in the other side's top-{len(top_b[i])} {top_b[i]}"
            assert b in top_a[i], f"token {i}: {b} not in the other side's top-{len(top_a[i])} {top_a[i]}"
            return MatchResult(False, i)
    assert len(tokens_a) == len(tokens_b), f"lengths {len(tokens_a)} and {len(tokens_b)} with no other difference"
    return MatchResult(True, None)
