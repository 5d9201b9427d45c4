"""Scheduler counters the services expose (Prometheus, Redis, the stats RPC)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from services.scheduler.prefix_cache import PrefixCacheCounters
from shared.request_io import FinishReason


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # fraction of blocks referenced by requests
    num_steps: int = 0
    num_preemptions: int = 0
    num_scheduled_tokens_last_step: int = 0
    num_scheduled_tokens_total: int = 0
    num_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_evictions: int = 0
    num_prefix_deferrals: int = 0  # times a waiting request sat out a step: a running one was computing its prefix

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def record_step(self, num_scheduled_tokens: int, num_preempted: int) -> None:
        self.num_steps += 1
        self.num_preemptions += num_preempted
        self.num_scheduled_tokens_last_step = num_scheduled_tokens
        self.num_scheduled_tokens_total += num_scheduled_tokens

    def record_deferral(self) -> None:
        self.num_prefix_deferrals += 1

    def record_finish(self, reason: FinishReason) -> None:
        self.num_finished[reason.value] = self.num_finished.get(reason.value, 0) + 1

    def snapshot(self, num_running: int, num_waiting: int, kv_usage: float,
                 prefix: PrefixCacheCounters) -> SchedulerStats:
        return replace(self, num_running=num_running, num_waiting=num_waiting, kv_usage=kv_usage,
                       num_finished=dict(self.num_finished), prefix_cache_queries=prefix.num_queries,
                       prefix_cache_hits=prefix.num_hits, prefix_cache_evictions=prefix.num_evictions)
