"""Each replica's own Overlap, computed in a real Redis from three replicas' published block sets, is exactly the
shared definition's (the gateways' number), and the deletion costs order the replicas most duplicated first."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.cluster.deletion_cost import deletion_cost
from pagedserve.services.scheduler.cluster.own_overlap import other_instances, own_overlap
from pagedserve.shared.block_overlap import Overlap, overlaps
from pagedserve.shared.redis_client import bounded_client
from pagedserve.shared.replica_keys import prefix_blocks_key, stats_key


def block(n: int) -> str:
    return f"{n:032x}"  # a hex block key, as the prefix publisher writes them


# a: 1-10; b: 6-15; c: 10-12. Unique: a 1-5 (5 of 10), b 13-15 (3 of 10), c none (0 of 3).
SETS = {"engine-a": set(range(1, 11)), "engine-b": set(range(6, 16)), "engine-c": {10, 11, 12}}


@pytest.mark.asyncio
async def test_three_replicas_exact_ratios_and_cost_order(redis_server):
    sync = redis_server.client()
    for name, numbers in SETS.items():
        sync.sadd(prefix_blocks_key(name), *map(block, numbers))
        sync.hset(stats_key(name), mapping={"num_running": 0})  # other keys of the replica are not block sets
    sync.set(prefix_blocks_key("decoy"), "not a set")  # SDIFF on it would fail: only sets are replicas
    client = bounded_client(redis_server.url, 2.0)
    try:
        found = {name: await own_overlap(client, name) for name in SETS}
        assert await other_instances(client, "engine-a") == ["engine-b", "engine-c"]
        absent = await own_overlap(client, "engine-new")
    finally:
        await client.aclose()
    assert found == {"engine-a": Overlap(10, 5), "engine-b": Overlap(10, 3), "engine-c": Overlap(3, 0)}
    assert found == overlaps({name: set(map(str.encode, map(block, numbers))) for name, numbers in SETS.items()})
    assert [found[n].duplicated_ratio for n in SETS] == [0.5, 0.7, 1.0]
    costs = {name: deletion_cost(overlap) for name, overlap in found.items()}
    assert costs == {"engine-a": 500, "engine-b": 300, "engine-c": 0}
    assert sorted(costs, key=costs.get) == ["engine-c", "engine-b", "engine-a"]  # removed first: most duplicated
    assert absent == Overlap(0, 0) and deletion_cost(absent) == 0  # an empty cache loses nothing
    assert not [key for key in sync.keys("*") if "scratch" in key]  # the scratch set never outlives its MULTI


def test_cost_never_rises_with_the_duplicated_ratio():
    costs = [deletion_cost(Overlap(1000, unique)) for unique in range(1000, -1, -1)]  # ratio 0 .. 1
    assert costs == sorted(costs, reverse=True) and (costs[0], costs[-1]) == (1000, 0)
