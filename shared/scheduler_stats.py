"""The scheduler's figures in one shape: `SchedulerStats`, a snapshot whose field names are the GetStats message's
field names, whose metadata names its Prometheus metric, and whose scalars are the Redis stats hash.

Shared because the scheduler fills it and the gateway reads it (routing, its replica metrics); the scheduler's
mutable counters that feed it live in services/scheduler/scheduler_counters.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

MetricKind = Literal["counter", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    """How a stats field is exposed to Prometheus: a counter's name gets `_total` appended by the client library."""

    kind: MetricKind
    name: str
    documentation: str
    label: str | None = None  # for dict fields: the label their keys become


def _metric(kind: MetricKind, name: str, documentation: str, label: str | None = None) -> dict[str, MetricSpec]:
    return {"metric": MetricSpec(kind, name, documentation, label)}


@dataclass(frozen=True)
class SchedulerStats:
    """One consistent snapshot of a scheduler service (see the module docstring for where each field goes)."""

    num_running: int = field(default=0, metadata=_metric(
        "gauge", "pagedserve_num_requests_running", "requests holding KV blocks (running or in prefill)"))
    num_waiting: int = field(default=0, metadata=_metric(
        "gauge", "pagedserve_num_requests_waiting", "requests queued in the scheduler (new or preempted)"))
    kv_usage: float = field(default=0.0, metadata=_metric(
        "gauge", "pagedserve_kv_cache_usage_perc", "fraction of KV blocks referenced by requests, in [0, 1]"))
    num_kv_blocks: int = field(default=0, metadata=_metric(
        "gauge", "pagedserve_num_kv_blocks", "size of the KV block pool the worker allocated"))
    num_steps: int = field(default=0, metadata=_metric("counter", "pagedserve_engine_steps", "engine steps run"))
    num_preemptions: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_num_preemptions", "requests preempted (blocks taken back, recomputed later)"))
    num_scheduled_tokens_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_scheduled_tokens", "tokens computed over all steps (prefill chunks and decodes)"))
    num_prompt_tokens_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_prompt_tokens", "prompt tokens of requests that produced their first token"))
    num_generation_tokens_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_generation_tokens", "output tokens generated"))
    num_finished: dict[str, int] = field(default_factory=dict, metadata=_metric(
        "counter", "pagedserve_request_success", "finished requests by finish reason", label="finished_reason"))
    prefix_cache_queries: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_prefix_cache_queries", "prompt tokens looked up in the prefix cache"))
    prefix_cache_hits: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_prefix_cache_hits", "of those, prompt tokens found in the prefix cache"))
    prefix_cache_evictions: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_prefix_cache_evictions", "cached blocks handed out for new data"))
    num_prefix_deferrals: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_prefix_deferrals", "steps a waiting request sat out while another computed its prefix"))
    num_state_writes: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_redis_writes", "Redis state writes done (observability copy, off the hot path)"))
    num_state_writes_dropped: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_redis_writes_dropped", "Redis state writes dropped (slow, down, or queue full)"))
    state_store_connected: bool = field(default=False, metadata=_metric(
        "gauge", "pagedserve_redis_connected", "1 when the last Redis flush succeeded"))
    # nanoseconds here, seconds in Prometheus (the collector converts fields named *_ns_total)
    worker_step_ns_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_worker_step_seconds", "worker time in engine steps (forward pass and sampling)"))
    worker_sample_ns_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_worker_sample_seconds", "of the worker's step time, sampling"))
    worker_idle_ns_total: int = field(default=0, metadata=_metric(
        "counter", "pagedserve_worker_idle_seconds",
        "worker waiting between back-to-back steps (round trips, scheduling): what async scheduling hides"))

    # label values: the tenant names the gateway sends (its keys file's), so a client cannot add a series
    kv_blocks_by_tenant: dict[str, int] = field(default_factory=dict, metadata=_metric(
        "gauge", "pagedserve_tenant_kv_blocks",
        "KV blocks a tenant holds or has cached (its quota counts both); tenants with none are absent",
        label="tenant"))

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


STATS_FIELDS = tuple(fields(SchedulerStats))
DICT_FIELDS = tuple(f.name for f in STATS_FIELDS if f.metadata["metric"].label)  # num_finished, kv_blocks_by_tenant
SCALAR_FIELDS = tuple(f.name for f in STATS_FIELDS if f.name not in DICT_FIELDS)


def redis_fields(stats: SchedulerStats) -> dict[str, int | float]:
    """The Redis stats hash: every scalar field by its name, and `num_finished.<reason>` per finish reason. The
    per-tenant blocks are left out: the hash is updated field by field, so a tenant whose blocks dropped to none
    would keep its last count there."""
    values = {name: getattr(stats, name) for name in SCALAR_FIELDS}
    values = {name: int(v) if isinstance(v, bool) else v for name, v in values.items()}
    return values | {f"num_finished.{reason}": count for reason, count in stats.num_finished.items()}
