"""The router's Prometheus series, labelled by replica (its instance id): how requests are spread and how well
prefix routing predicts the cache (predicted vs real cached tokens), plus the replicas' state at scrape time.

Named pagedserve_gateway_*: they count this gateway's own decisions (engine figures stay on the schedulers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from services.gateway.routing.router import Route, Router

_DECISION_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01)
_REPLICA = ("replica",)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, documentation: str, labels: tuple[str, ...] = _REPLICA) -> Counter:
            return Counter(f"pagedserve_gateway_{name}", documentation, list(labels), registry=registry)

        self.requests = counter("routed_requests", "scheduler requests routed to each replica")
        self.prefix_hits = counter("route_prefix_hits",
                                   "requests sent to a replica because it held more of the prompt than another")
        self.predicted_cached_tokens = counter("route_predicted_cached_tokens",
                                               "prompt tokens the router expected the replica to have cached")
        self.cached_tokens = counter("route_cached_tokens",
                                     "prompt tokens the replica served from its cache (finished requests)")
        self.prompt_tokens = counter("route_prompt_tokens", "prompt tokens of finished requests")
        self.retries = counter("route_retries",
                               "requests that failed on the replica before any output and were retried elsewhere")
        self.fallbacks = counter("route_fallbacks", "prefix-routing decisions made without the Redis index "
                                 "(consistent hash of the first block, plus load)", labels=())
        self.decision_seconds = Histogram("pagedserve_gateway_route_decision_seconds", "time to pick a replica",
                                          buckets=_DECISION_BUCKETS_S, registry=registry)

    def routed(self, route: Route) -> None:
        name = route.replica.name
        self.requests.labels(name).inc()
        if route.choice.because_of_prefix:
            self.prefix_hits.labels(name).inc()
        predicted = min(route.choice.predicted_cached_blocks * route.replica.model.block_size,
                        route.num_prompt_tokens)
        self.predicted_cached_tokens.labels(name).inc(predicted)

    def finished(self, name: str, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.prompt_tokens.labels(name).inc(num_prompt_tokens)
        self.cached_tokens.labels(name).inc(num_cached_tokens)


class ReplicaStateCollector:
    """Gauges read at scrape time: each replica's health, open calls and load as the router sees them."""

    def __init__(self, router: Router) -> None:
        self.router = router

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
        for replica in router.replicas.replicas.values():
            values = [replica.name, replica.address]
            up.add_metric(values, int(replica.routable))
            in_flight.add_metric(values, replica.num_in_flight)
            load.add_metric(values, router.load_of(replica))
            view = router.mirror.view(replica.name) if router.mirror is not None else None
            indexed.add_metric(values, len(view.keys) if view is not None else 0)
        yield from (up, in_flight, load, indexed)
        index_up = int(router.mirror is not None and router.mirror.connected)
        yield GaugeMetricFamily("pagedserve_gateway_prefix_index_up", "1 while the replicas' prefix indexes are read "
                                "from Redis; 0: prefix routing falls back to consistent hashing", value=index_up)
        info = GaugeMetricFamily("pagedserve_gateway_routing_info", "the routing policy", labels=["policy"])
        info.add_metric([router.config.policy], 1)
        yield info
