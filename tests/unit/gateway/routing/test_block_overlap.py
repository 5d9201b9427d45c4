"""The scale-down victim signal: each replica's cached blocks that others also hold, by exact set comparison, as
the gateway's /metrics exposes it from its prefix mirror."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from pagedserve.services.gateway.routing.block_overlap import OverlapCache
from pagedserve.services.gateway.routing.prefix_mirror import InstanceView, PrefixMirror
from pagedserve.services.gateway.routing.replica_gauges import ReplicaStateCollector
from pagedserve.shared.block_overlap import Overlap, overlaps


def test_unique_blocks_are_those_no_other_replica_holds():
    found = overlaps({"a": {b"1", b"2", b"3"}, "b": {b"2", b"3", b"4"}, "c": {b"3"}, "d": set()})
    assert found == {"a": Overlap(3, 1), "b": Overlap(3, 1), "c": Overlap(1, 0), "d": Overlap(0, 0)}
    assert found["a"].duplicated_ratio == 2 / 3
    assert found["c"].duplicated_ratio == 1.0  # all of it elsewhere: the cheapest to remove
    assert found["d"].duplicated_ratio == 1.0  # nothing cached, nothing lost
    assert overlaps({"only": {b"1", b"2"}})["only"] == Overlap(2, 2)  # alone, everything is unique


def test_the_cache_recomputes_when_an_index_changes():
    cache, keys = OverlapCache(), {"a": {b"1"}, "b": {b"1"}}
    first = cache.get(keys, {"a": 1, "b": 1})
    assert first["a"] == Overlap(1, 0) and cache.get(keys, {"a": 1, "b": 1}) is first
    keys["b"] = {b"2"}
    assert cache.get(keys, {"a": 1, "b": 2})["a"] == Overlap(1, 1)


def _router(views: dict[str, set[bytes]], synced: set[str]):
    mirror = PrefixMirror("redis://127.0.0.1:1/0")
    mirror.connected = True
    for seq, (name, keys) in enumerate(views.items(), 1):
        mirror.views[name] = InstanceView(keys=keys, seq=seq, synced=name in synced)
    replicas = {name: SimpleNamespace(name=name, address=f"10.0.0.{i}:50051", routable=True, num_in_flight=0)
                for i, name in enumerate(views)}
    return SimpleNamespace(replicas=SimpleNamespace(replicas=replicas), mirror=mirror, load_of=lambda replica: 0,
                           config=SimpleNamespace(policy="prefix"))


def test_the_gateway_exposes_it_per_replica_whose_index_is_current():
    registry = CollectorRegistry()
    registry.register(ReplicaStateCollector(_router({"engine-0": {b"1", b"2"}, "engine-1": {b"2"},
                                                     "engine-2": {b"9"}}, synced={"engine-0", "engine-1"})))
    text = generate_latest(registry).decode()
    assert 'pagedserve_gateway_replica_duplicated_blocks_ratio{address="10.0.0.0:50051",replica="engine-0"} 0.5' \
        in text
    assert 'pagedserve_gateway_replica_duplicated_blocks_ratio{address="10.0.0.1:50051",replica="engine-1"} 1.0' \
        in text
    assert 'pagedserve_gateway_replica_unique_blocks{address="10.0.0.0:50051",replica="engine-0"} 1.0' in text
    assert 'pagedserve_gateway_prefix_index_blocks{address="10.0.0.2:50051",replica="engine-2"} 0.0' in text
    # engine-2's index is not current: no victim signal for it rather than a misleading one
    assert "engine-2" not in "".join(line for line in text.splitlines() if "duplicated_blocks" in line)
