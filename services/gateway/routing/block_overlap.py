"""Each replica's Overlap (shared/block_overlap.py) from the exact block sets the gateway mirrors from Redis,
exported per replica as the scale-down victim signal.

Contract: the result is kept until some replica's index changes (its event seq), so scrapes between changes cost
nothing; a change costs one pass over all keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pagedserve.shared.block_overlap import Overlap, overlaps


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
