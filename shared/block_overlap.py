"""How much of a replica's prefix cache the other replicas also hold: the scale-down victim signal (the replica
whose cached blocks are most duplicated elsewhere loses the fewest cached prefixes when it goes).

Contract: `blocks` is the number of block keys in a replica's index and `unique` the number no other replica's
index holds (an exact set comparison); `duplicated_ratio` is (blocks - unique) / blocks, and 1.0 for an empty cache
(removing it loses nothing). The gateways compute it for every replica from the sets they mirror (overlaps());
each scheduler computes its own in Redis (services/scheduler/cluster/own_overlap.py): one definition for both.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Overlap:
    blocks: int
    unique: int  # held by no other replica

    @property
    def duplicated_ratio(self) -> float:
        return (self.blocks - self.unique) / self.blocks if self.blocks else 1.0


def overlaps(key_sets: Mapping[str, set[bytes]]) -> dict[str, Overlap]:
    """Replica -> its Overlap with all the others (one pass over all keys, a C-level Counter)."""
    holders = Counter(itertools.chain.from_iterable(key_sets.values()))
    return {name: Overlap(len(keys), sum(1 for key in keys if holders[key] == 1)) for name, keys in key_sets.items()}
