"""The scheduler's own Prometheus metrics: its stats (gauges and counters) and per-request latency histograms.

Every scheduler serves these on its own /metrics (see metrics_server.py), so N schedulers behind M gateways are
counted once each. Names follow vLLM's (`vllm:x` -> `pagedserve_x`); docs/operations.md has the mapping table.
Every sample carries `model_name`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram, disable_created_metrics, generate_latest

from pagedserve.services.scheduler.spec_decode.metrics import SpecDecodeCollector, SpecSource
from pagedserve.services.scheduler.stats_collector import StatsCollector
from pagedserve.shared.block_overlap import Overlap
from pagedserve.shared.scheduler_stats import SchedulerStats

# Seconds: from a few ms (a decode step) to minutes (a long queue); close to vLLM's buckets.
LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class SchedulerMetrics:
    """The registry one scheduler process exposes. `stats_source` gives (snapshot, model name) or None."""

    def __init__(self, stats_source: Callable[[], tuple[SchedulerStats, str] | None],
                 spec_source: SpecSource | None = None) -> None:
        disable_created_metrics()  # no *_created samples: they double the output and nobody here reads them
        self.registry = CollectorRegistry()
        self.registry.register(StatsCollector(stats_source))
        if spec_source is not None:
            self.registry.register(SpecDecodeCollector(spec_source))

        def histogram(name: str, documentation: str, buckets: tuple) -> Histogram:
            return Histogram(name, documentation, ["model_name"], buckets=buckets, registry=self.registry)

        self.time_to_first_token = histogram(
            "pagedserve_time_to_first_token_seconds", "from arrival at the scheduler to the first token",
            LATENCY_BUCKETS_S)
        self.inter_token_latency = histogram(
            "pagedserve_inter_token_latency_seconds", "between two consecutive output tokens of a request",
            ITL_BUCKETS_S)
        self.e2e_request_latency = histogram(
            "pagedserve_e2e_request_latency_seconds", "from arrival at the scheduler to the request's end",
            LATENCY_BUCKETS_S)
        self.request_queue_time = histogram(
            "pagedserve_request_queue_time_seconds", "waiting before the first step that scheduled the request",
            LATENCY_BUCKETS_S)
        self.request_prefill_time = histogram(
            "pagedserve_request_prefill_time_seconds", "from first scheduled to the first token (prompt compute)",
            LATENCY_BUCKETS_S)
        self.request_decode_time = histogram(
            "pagedserve_request_decode_time_seconds", "from the first token to the request's end", LATENCY_BUCKETS_S)
        self.request_inference_time = histogram(
            "pagedserve_request_inference_time_seconds", "from first scheduled to the request's end",
            LATENCY_BUCKETS_S)
        self.request_prompt_tokens = histogram(
            "pagedserve_request_prompt_tokens", "prompt length of finished requests", TOKEN_BUCKETS)
        self.request_generation_tokens = histogram(
            "pagedserve_request_generation_tokens", "output tokens of finished requests", TOKEN_BUCKETS)
        self.iteration_tokens = histogram(
            "pagedserve_iteration_tokens", "tokens computed in one engine step (prefill chunks and decodes)",
            TOKEN_BUCKETS)

        # set by the pod deletion cost updater (services/scheduler/cluster), absent while it is off
        self.duplicated_blocks_ratio = Gauge(
            "pagedserve_replica_duplicated_blocks_ratio", "share of this replica's cached KV blocks that another "
            "replica also holds (1: removing it loses no cached prefix); the scale-down victim signal",
            ["model_name"], registry=self.registry)
        self.unique_blocks = Gauge(
            "pagedserve_replica_unique_blocks", "cached KV blocks of this replica that no other replica holds",
            ["model_name"], registry=self.registry)
        self.pod_deletion_cost = Gauge(
            "pagedserve_pod_deletion_cost", "the controller.kubernetes.io/pod-deletion-cost this replica asks for "
            "(lowest: removed first on scale-down)", ["model_name"], registry=self.registry)

    def set_overlap(self, model_name: str, overlap: Overlap, cost: int) -> None:
        self.duplicated_blocks_ratio.labels(model_name).set(overlap.duplicated_ratio)
        self.unique_blocks.labels(model_name).set(overlap.unique)
        self.pod_deletion_cost.labels(model_name).set(cost)

    def render(self) -> bytes:
        return generate_latest(self.registry)
