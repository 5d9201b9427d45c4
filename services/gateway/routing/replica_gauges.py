"""Gauges read at scrape time from the router: each replica's health, open calls, load and indexed prefix blocks,
how much of its cache the other replicas duplicate (the scale-down victim signal, shared/block_overlap.py; only for
replicas whose index is current), whether the prefix index is current, and the routing policy."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from pagedserve.services.gateway.routing.block_overlap import OverlapCache
from pagedserve.services.gateway.routing.router import Router


class ReplicaStateCollector:
    """Gauges read at scrape time: each replica's health, open calls and load as the router sees them."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.overlap = OverlapCache()

    def collect(self):
        router, labels = self.router, ["replica", "address"]
        up = GaugeMetricFamily("pagedserve_gateway_replica_up", "1 while the replica is routable", labels=labels)
        in_flight = GaugeMetricFamily("pagedserve_gateway_replica_in_flight",
                                      "this gateway's open requests on the replica", labels=labels)
        load = GaugeMetricFamily("pagedserve_gateway_replica_load",
                                 "requests running or waiting on the replica, as routing counts them", labels=labels)
        indexed = GaugeMetricFamily("pagedserve_gateway_prefix_index_blocks",
                                    "cached KV blocks of the replica in this gateway's prefix index (0 while the index "
                                    "is not current)", labels=labels)
        duplicated = GaugeMetricFamily(
            "pagedserve_gateway_replica_duplicated_blocks_ratio", "share of the replica's cached KV blocks that "
            "another replica also holds (1: removing it loses no cached prefix); the scale-down victim signal",
            labels=labels)
        unique = GaugeMetricFamily("pagedserve_gateway_replica_unique_blocks",
                                   "cached KV blocks of the replica that no other replica holds", labels=labels)
        views = {}
        for replica in router.replicas.replicas.values():
            values = [replica.name, replica.address]
            up.add_metric(values, int(replica.routable))
            in_flight.add_metric(values, replica.num_in_flight)
            load.add_metric(values, router.load_of(replica))
            view = router.mirror.view(replica.name) if router.mirror is not None else None
            indexed.add_metric(values, len(view.keys) if view is not None else 0)
            if view is not None:
                views[replica.name] = (replica.address, view)
        found = self.overlap.get({name: view.keys for name, (_, view) in views.items()},
                                 {name: view.seq for name, (_, view) in views.items()})
        for name, (address, _) in views.items():
            duplicated.add_metric([name, address], found[name].duplicated_ratio)
            unique.add_metric([name, address], found[name].unique)
        yield from (up, in_flight, load, indexed, duplicated, unique)
        index_up = int(router.mirror is not None and router.mirror.connected)
        yield GaugeMetricFamily("pagedserve_gateway_prefix_index_up", "1 while the replicas' prefix indexes are read "
                                "from Redis; 0: prefix routing falls back to consistent hashing", value=index_up)
        info = GaugeMetricFamily("pagedserve_gateway_routing_info", "the routing policy", labels=["policy"])
        info.add_metric([router.config.policy], 1)
        yield info
