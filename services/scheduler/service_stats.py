"""What the scheduler service reports through GetStats: the scheduler's counters plus its Redis writer's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ServiceStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks referenced by requests
    num_steps: int = 0
    num_preemptions: int = 0
    num_scheduled_tokens_total: int = 0
    num_finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of those, tokens found cached
    prefix_cache_evictions: int = 0
    num_kv_blocks: int = 0
    num_state_writes: int = 0  # Redis writes done
    num_state_writes_dropped: int = 0  # Redis writes dropped (slow, down, or queue full)
    state_store_connected: bool = False  # the last Redis flush succeeded
    num_prefix_deferrals: int = 0  # steps a waiting request sat out while a running one computed its prefix
