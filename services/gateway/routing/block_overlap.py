"""How much of each replica's prefix cache the other replicas also hold, from the exact block sets the gateway
mirrors from Redis: the signal for choosing which engine to remove on scale-down (the one whose cached blocks are
most duplicated elsewhere loses the fewest cached prefixes when it goes).

Contract: for each replica, `blocks` is the number of block keys in its index and `unique` the number no other
replica's index holds (an exact set comparison); `duplicated_ratio` is (blocks - unique) / blocks, and 1.0 for an
empty cache (removing it loses nothing). The result is kept until some replica's index changes (its event seq),
so scrapes between changes cost nothing; a change costs one pass over all keys (a C-level Counter).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Overlap:
    blocks: int
    unique: int  # held by no other replica

    @property
    def duplicated_ratio(self) -> float:
        return (self.blocks - self.unique) / self.blocks if self.blocks else 1.0


def overlaps(key_sets: Mapping[str, set[bytes]]) -> dict[str, Overlap]:
    """Replica -> its Overlap with all the others."""
    holders = Counter(itertools.chain.from_iterable(key_sets.values()))
    return {name: Overlap(len(keys), sum(1 for key in keys if holders[key] == 1)) for name, keys in key_sets.items()}


@dataclass
class OverlapCache:
    """overlaps() of the last state seen, recomputed when a replica's (name, seq) changes."""

    _state: tuple = ()
    _result: dict[str, Overlap] = field(default_factory=dict)

    def get(self, key_sets: Mapping[str, set[bytes]], seqs: Mapping[str, int]) -> dict[str, Overlap]:
        state = tuple(sorted((name, seqs.get(name, 0), len(keys)) for name, keys in key_sets.items()))
        if state != self._state:
            self._state, self._result = state, overlaps(key_sets)
        return self._result
