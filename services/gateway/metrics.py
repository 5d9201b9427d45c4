"""Prometheus metrics: the gateway's own request counters and latencies, plus the scheduler's stats.

Scheduler stats are fetched with GetStats when /metrics is scraped and rendered under fixed names
(pagedserve_prefix_cache_hits_total, pagedserve_kv_cache_usage_ratio, ...).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from services.scheduler.service_stats import ServiceStats

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class SchedulerStatsCollector:
    """Renders the last fetched ServiceStats; pagedserve_scheduler_up says whether the fetch worked."""

    def __init__(self) -> None:
        self.stats: ServiceStats | None = None

    def collect(self):
        yield GaugeMetricFamily("pagedserve_scheduler_up", "1 when the scheduler answered GetStats",
                                value=0 if self.stats is None else 1)
        if self.stats is None:
            return
        s = self.stats
        counters = [
            ("pagedserve_prefix_cache_hits", "prompt tokens found in the prefix cache", s.prefix_cache_hits),
            ("pagedserve_prefix_cache_queries", "prompt tokens looked up in the prefix cache", s.prefix_cache_queries),
            ("pagedserve_prefix_cache_evictions", "cached blocks handed out for new data", s.prefix_cache_evictions),
            ("pagedserve_num_preemptions", "requests preempted (blocks taken back)", s.num_preemptions),
            ("pagedserve_prefix_deferrals", "steps a request waited for a prefix another was computing",
             s.num_prefix_deferrals),
            ("pagedserve_num_steps", "engine steps run", s.num_steps),
            ("pagedserve_scheduled_tokens", "tokens computed over all steps", s.num_scheduled_tokens_total),
            ("pagedserve_redis_writes", "Redis state writes done", s.num_state_writes),
            ("pagedserve_redis_writes_dropped", "Redis state writes dropped", s.num_state_writes_dropped),
        ]
        for name, documentation, value in counters:
            yield CounterMetricFamily(name, documentation, value=value)
        finished = CounterMetricFamily("pagedserve_requests_finished", "finished requests by reason", labels=["reason"])
        for reason, count in sorted(s.num_finished.items()):
            finished.add_metric([reason], count)
        yield finished
        gauges = [
            ("pagedserve_kv_cache_usage_ratio", "fraction of KV blocks referenced by requests", s.kv_usage),
            ("pagedserve_num_requests_running", "requests holding KV blocks", s.num_running),
            ("pagedserve_num_requests_waiting", "requests queued in the scheduler", s.num_waiting),
            ("pagedserve_num_kv_blocks", "size of the KV block pool", s.num_kv_blocks),
            ("pagedserve_redis_connected", "1 when the last Redis flush succeeded", int(s.state_store_connected)),
        ]
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)


class GatewayMetrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created samples: they double the output and nobody here reads them
        self.registry = CollectorRegistry()
        self.scheduler = SchedulerStatsCollector()
        self.registry.register(self.scheduler)
        self.http_requests = Counter("pagedserve_http_requests", "HTTP requests by route and status",
                                     ["route", "status"], registry=self.registry)
        self.request_latency = Histogram("pagedserve_request_latency_seconds", "generation requests, end to end",
                                         ["endpoint"], buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.time_to_first_token = Histogram("pagedserve_time_to_first_token_seconds",
                                             "from the request to its first text", ["endpoint"],
                                             buckets=_LATENCY_BUCKETS_S, registry=self.registry)
        self.prompt_tokens = Counter("pagedserve_prompt_tokens", "prompt tokens of finished requests",
                                     registry=self.registry)
        self.generation_tokens = Counter("pagedserve_generation_tokens", "output tokens of finished requests",
                                         registry=self.registry)

    def render(self, stats: ServiceStats | None) -> bytes:
        self.scheduler.stats = stats
        return generate_latest(self.registry)
