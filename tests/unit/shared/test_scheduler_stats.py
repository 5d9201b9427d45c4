"""One stats shape: SchedulerStats fields become the Redis hash by name and Prometheus metrics by their metadata."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.services.scheduler.stats_collector import StatsCollector
from pagedserve.shared.scheduler_stats import SCALAR_FIELDS, STATS_FIELDS, SchedulerStats, redis_fields

STATS = SchedulerStats(num_running=3, num_waiting=2, kv_usage=0.25, num_kv_blocks=100, num_steps=7,
                       num_preemptions=1, num_scheduled_tokens_total=90, num_prompt_tokens_total=40,
                       num_generation_tokens_total=50, num_finished={"stop": 4, "length": 1},
                       prefix_cache_queries=64, prefix_cache_hits=32, prefix_cache_evictions=2,
                       num_prefix_deferrals=5, num_state_writes=11, num_state_writes_dropped=1,
                       state_store_connected=True, worker_step_ns_total=2_500_000_000,
                       worker_sample_ns_total=250_000_000, worker_idle_ns_total=500_000_000,
                       kv_blocks_by_tenant={"team-a": 12})


def test_redis_hash_holds_every_scalar_by_name_and_each_finish_reason():
    fields = redis_fields(STATS)
    assert set(fields) == set(SCALAR_FIELDS) | {"num_finished.stop", "num_finished.length"}
    assert (fields["num_running"], fields["kv_usage"], fields["state_store_connected"]) == (3, 0.25, 1)
    assert (fields["num_finished.stop"], fields["num_finished.length"]) == (4, 1)  # not the per-tenant blocks


def _samples(stats: SchedulerStats | None) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(StatsCollector(lambda: None if stats is None else (stats, "m")))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_field_is_exposed_under_its_metric_with_the_model_name():
    samples = _samples(STATS)
    for f in STATS_FIELDS:
        spec = f.metadata["metric"]
        name = spec.name + ("_total" if spec.kind == "counter" else "")
        if spec.label:
            for key, count in getattr(STATS, f.name).items():
                assert samples[name, tuple(sorted(((spec.label, key), ("model_name", "m"))))] == count
        else:  # durations kept in ns are exposed in seconds
            value = getattr(STATS, f.name) / (1e9 if f.name.endswith("_ns_total") else 1)
            assert samples[name, (("model_name", "m"),)] == float(value), f.name
    assert len(samples) == len(STATS_FIELDS) + 1  # num_finished has two reasons, kv_blocks_by_tenant one tenant


def test_worker_times_are_exposed_in_seconds():
    samples = _samples(STATS)
    assert samples["pagedserve_worker_step_seconds_total", (("model_name", "m"),)] == 2.5
    assert samples["pagedserve_worker_sample_seconds_total", (("model_name", "m"),)] == 0.25
    assert samples["pagedserve_worker_idle_seconds_total", (("model_name", "m"),)] == 0.5


def test_nothing_is_exposed_before_the_worker_described_itself():
    assert _samples(None) == {}
