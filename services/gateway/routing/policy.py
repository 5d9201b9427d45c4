"""Routing policies: which live replica gets a request. Pure functions of what the router knows.

prefix (default). For each live replica r, with P the prompt's tokens, B the block size, H_r the leading blocks of
the prompt r holds in its prefix cache (from its published index, plus blocks of prompts this gateway sent it in
the last --routing-pending-ttl-s), L_r its load (requests running or waiting there) and W the tokens one queued
request is worth (--routing-load-cost-tokens):

    cost_r = (P - B * H_r) + W * L_r        the prompt tokens r must compute, plus its queue in token units

and the cheapest replica wins; ties go to the replica first in the rendezvous order of the prompt's first block
(so equal replicas split prefixes between them, and a prefix keeps its replica). A replica holding a 1,000-token
prefix keeps its requests until it runs about 1,000 / W more requests than another. Without the index (Redis down
or not configured) H_r is unknown: the rendezvous owner of the first block counts as holding the whole prompt, the
others nothing, so each prefix still sticks to one replica, weighed against load the same way.

least-load: the fewest requests, ties rotating. round-robin: the live replicas in turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from pagedserve.services.gateway.routing.replicas import Replica

RoutingPolicy = Literal["prefix", "least-load", "round-robin"]


@dataclass(frozen=True)
class Candidate:
    name: str  # the replica's instance id
    load: int  # requests running or waiting there (see Router.load_of)
    cached_blocks: int  # leading blocks of the prompt it is predicted to hold


@dataclass(frozen=True)
class Choice:
    index: int  # into the candidates
    predicted_cached_blocks: int
    because_of_prefix: bool  # it holds more of the prompt than some other candidate: the prefix told them apart


def rendezvous_ranks(names: Sequence[str], key: bytes) -> list[int]:
    """Each name's rank (0 = first) in the highest-random-weight order for `key`: stable when others come and go."""
    weights = [hashlib.blake2b(key + name.encode(), digest_size=8).digest() for name in names]
    order = sorted(range(len(names)), key=lambda i: weights[i], reverse=True)
    ranks = [0] * len(names)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def choose_by_prefix(candidates: Sequence[Candidate], num_prompt_tokens: int, block_size: int,
                     load_cost_tokens: int, ranks: Sequence[int]) -> Choice:
    def cost(i: int) -> tuple[int, int, int]:
        c = candidates[i]
        return num_prompt_tokens - block_size * c.cached_blocks + load_cost_tokens * c.load, c.load, ranks[i]

    best = min(range(len(candidates)), key=cost)
    held = candidates[best].cached_blocks
    return Choice(best, held, held > 0 and held > min(c.cached_blocks for c in candidates))


def choose_least_load(candidates: Sequence[Candidate], turn: int) -> Choice:
    n = len(candidates)
    best = min(range(n), key=lambda i: (candidates[i].load, (i - turn) % n))
    return Choice(best, candidates[best].cached_blocks, False)


def choose_round_robin(candidates: Sequence[Candidate], turn: int) -> Choice:
    best = turn % len(candidates)
    return Choice(best, candidates[best].cached_blocks, False)


@dataclass
class Route:
    """The router's decision for one scheduler request: the replica and why (the policy's choice)."""

    replica: Replica
    choice: Choice
    num_prompt_tokens: int
