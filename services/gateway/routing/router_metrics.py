"""The router's Prometheus series, labelled by replica (its instance id): how requests are spread and how well
prefix routing predicts the cache (predicted vs real cached tokens). The replicas' state at scrape time is in
replica_gauges.py.

Named pagedserve_gateway_*: they count this gateway's own decisions (engine figures stay on the schedulers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from pagedserve.services.gateway.routing.policy import Route

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
        self.resumed = Counter("pagedserve_requests_resumed", "requests resumed on another replica as a "
                               "continuation, by why they left theirs (replica_failed, drain)", ["reason"],
                               registry=registry)
        for reason in ("replica_failed", "drain"):
            self.resumed.labels(reason)
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
