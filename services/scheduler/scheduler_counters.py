"""`SchedulerCounters`: the mutable part of the scheduler's figures, bumped on its hot path;
`Scheduler.snapshot_stats()` combines it with the gauges into a `SchedulerStats` (shared/scheduler_stats.py), and the
service adds its Redis writer's counters with `replace`."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.scheduler.prefix_cache import PrefixCacheCounters
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.scheduler_stats import SchedulerStats


@dataclass
class SchedulerCounters:
    """What the Scheduler counts as it goes; never read on the hot path, only snapshotted."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_scheduled_tokens_last_step: int = 0
    num_scheduled_tokens_total: int = 0
    num_prompt_tokens_total: int = 0
    num_generation_tokens_total: int = 0
    num_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    num_prefix_deferrals: int = 0  # times a waiting request sat out a step: a running one was computing its prefix
    worker_step_ns_total: int = 0  # worker time in steps: forward pass + sampling
    worker_sample_ns_total: int = 0  # of which sampling
    worker_idle_ns_total: int = 0  # the worker's wait between back-to-back steps (round trips, scheduling)

    def record_step(self, num_scheduled_tokens: int, num_preempted: int) -> None:
        self.num_steps += 1
        self.num_preemptions += num_preempted
        self.num_scheduled_tokens_last_step = num_scheduled_tokens
        self.num_scheduled_tokens_total += num_scheduled_tokens

    def record_token(self, num_prompt_tokens: int, is_first: bool) -> None:
        """One output token; a request's first also counts its prompt."""
        self.num_generation_tokens_total += 1
        if is_first:
            self.num_prompt_tokens_total += num_prompt_tokens

    def record_worker_times(self, step_ns: int, sample_ns: int, idle_ns: int) -> None:
        self.worker_step_ns_total += step_ns
        self.worker_sample_ns_total += sample_ns
        self.worker_idle_ns_total += idle_ns

    def record_deferral(self) -> None:
        self.num_prefix_deferrals += 1

    def record_finish(self, reason: FinishReason) -> None:
        self.num_finished[reason.value] = self.num_finished.get(reason.value, 0) + 1

    def snapshot(self, num_running: int, num_waiting: int, kv_usage: float, num_kv_blocks: int,
                 prefix: PrefixCacheCounters, kv_blocks_by_tenant: dict[str, int] | None = None) -> SchedulerStats:
        return SchedulerStats(
            num_running=num_running, num_waiting=num_waiting, kv_usage=kv_usage, num_kv_blocks=num_kv_blocks,
            num_steps=self.num_steps, num_preemptions=self.num_preemptions,
            num_scheduled_tokens_total=self.num_scheduled_tokens_total,
            num_prompt_tokens_total=self.num_prompt_tokens_total,
            num_generation_tokens_total=self.num_generation_tokens_total, num_finished=dict(self.num_finished),
            prefix_cache_queries=prefix.num_queries, prefix_cache_hits=prefix.num_hits,
            prefix_cache_evictions=prefix.num_evictions, num_prefix_deferrals=self.num_prefix_deferrals,
            worker_step_ns_total=self.worker_step_ns_total, worker_sample_ns_total=self.worker_sample_ns_total,
            worker_idle_ns_total=self.worker_idle_ns_total, kv_blocks_by_tenant=dict(kv_blocks_by_tenant or {}))
