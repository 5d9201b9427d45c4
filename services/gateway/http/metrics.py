"""The gateway's Prometheus metrics: HTTP-level figures only (requests, statuses, durations, in flight).

Engine figures (queue, KV cache, token latencies) come from each scheduler's own /metrics, so that several
gateways in front of one scheduler never count its numbers twice.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

_DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created samples: they double the output and nobody here reads them
        self.registry = CollectorRegistry()
        self.http_requests = Counter("pagedserve_http_requests", "HTTP requests by route and status",
                                     ["route", "status"], registry=self.registry)
        self.http_request_duration = Histogram(
            "pagedserve_http_request_duration_seconds", "from the request to the last byte of its response",
            ["route"], buckets=_DURATION_BUCKETS_S, registry=self.registry)
        self.http_time_to_first_byte = Histogram(
            "pagedserve_http_time_to_first_byte_seconds",
            "from the request to the first byte of its body (a stream's first token)", ["route"],
            buckets=_DURATION_BUCKETS_S, registry=self.registry)
        self.http_requests_in_flight = Gauge("pagedserve_http_requests_in_flight", "HTTP requests being served",
                                             registry=self.registry)
        self.shed_requests = Counter(
            "pagedserve_gateway_shed_requests",
            "generation requests refused (429) unread because every scheduler replica was refusing arrivals",
            registry=self.registry)
        self.scheduler_ready = Gauge("pagedserve_gateway_scheduler_ready",
                                     "1 while this gateway's scheduler reports ready", registry=self.registry)

    def render(self, scheduler_ready: bool) -> bytes:
        self.scheduler_ready.set(int(scheduler_ready))
        return generate_latest(self.registry)
