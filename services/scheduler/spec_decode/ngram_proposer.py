"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence of the context's tail.

The scheduler owns every request's tokens (prompt and accepted outputs), so proposing here keeps the worker free of
proposer state: drafts travel in the step like any other delta.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """Up to `max_drafts` tokens: for n from max_n down to min_n, find the latest earlier position where the
        last n tokens occur, and return what followed it. Empty when no n-gram recurs."""
        num_tokens = len(token_ids)
        if max_drafts <= 0 or num_tokens <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            # windows starting at 0 .. num_tokens - n - 1: each has at least one token after it
            windows = sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start:start + max_drafts].tolist()
        return []
