"""The routing policies as pure functions: the prefix cost formula, rendezvous ties, the baselines."""

from __future__ import annotations

from collections import Counter

from pagedserve.services.gateway.routing.policy import (
    Candidate,
    choose_by_prefix,
    choose_least_load,
    choose_round_robin,
    rendezvous_ranks,
)

P, B, W = 1000, 16, 128  # prompt tokens, block size, tokens a queued request is worth


def test_the_holder_keeps_the_prompt_until_its_queue_outweighs_the_prefix():
    ranks = [1, 0]  # the tie-break would pick the second
    for extra_load, expected in [(0, 0), (5, 0), (7, 0), (8, 1), (20, 1)]:
        candidates = [Candidate("a", 2 + extra_load, 62), Candidate("b", 2, 0)]
        choice = choose_by_prefix(candidates, P, B, W, ranks)
        # cost a = 1000 - 992 + 128 * (2 + x), cost b = 1000 + 256: a wins while 128 x < 992
        assert choice.index == expected, extra_load
        assert choice.because_of_prefix == (expected == 0)
        assert choice.predicted_cached_blocks == (62 if expected == 0 else 0)


def test_the_longer_hit_wins_at_equal_load_and_equal_holders_split_by_rendezvous():
    candidates = [Candidate("a", 1, 10), Candidate("b", 1, 30), Candidate("c", 1, 0)]
    assert choose_by_prefix(candidates, P, B, W, [0, 1, 2]).index == 1
    same = [Candidate("a", 0, 5), Candidate("b", 0, 5)]
    assert choose_by_prefix(same, P, B, W, [1, 0]).index == 1
    choice = choose_by_prefix(same, P, B, W, [0, 1])
    assert choice.index == 0 and not choice.because_of_prefix  # both hold it: the prefix told nobody apart


def test_without_any_hit_the_least_loaded_wins():
    candidates = [Candidate("a", 3, 0), Candidate("b", 1, 0), Candidate("c", 2, 0)]
    choice = choose_by_prefix(candidates, P, B, W, [0, 1, 2])
    assert choice.index == 1 and not choice.because_of_prefix


def test_rendezvous_moves_only_the_keys_of_a_replica_that_left():
    names = [f"replica-{i}" for i in range(8)]
    keys = [i.to_bytes(4, "little") for i in range(2000)]
    owner = {key: names[rendezvous_ranks(names, key).index(0)] for key in keys}
    spread = Counter(owner.values())
    assert min(spread.values()) > 2000 / 8 * 0.7, spread  # about even
    rest = [name for name in names if name != "replica-3"]
    for key in keys:
        new_owner = rest[rendezvous_ranks(rest, key).index(0)]
        assert new_owner == owner[key] or owner[key] == "replica-3"


def test_least_load_rotates_ties_and_round_robin_cycles():
    candidates = [Candidate(n, 0, 0) for n in "abc"]
    assert [choose_least_load(candidates, turn).index for turn in range(4)] == [0, 1, 2, 0]
    loaded = [Candidate("a", 2, 0), Candidate("b", 1, 0), Candidate("c", 1, 0)]
    assert {choose_least_load(loaded, turn).index for turn in range(6)} == {1, 2}
    assert [choose_round_robin(candidates, turn).index for turn in range(5)] == [0, 1, 2, 0, 1]
