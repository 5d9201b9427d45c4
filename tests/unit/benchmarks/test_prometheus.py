import pytest

from pagedserve.benchmarks.prometheus import COUNTERS, counter_deltas, find_metric, gauge_max, parse_prometheus_text

VLLM_BEFORE = """
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 50.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 7.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3.0
"""


def test_parse_sums_nothing_and_keeps_one_value_per_label_set():
    samples = parse_prometheus_text(VLLM_BEFORE)
    assert samples["vllm:prefix_cache_hits_total"] == [100.0, 50.0]
    assert samples["vllm:e2e_request_latency_seconds_bucket"] == [3.0]
    assert "# HELP" not in " ".join(samples)


def test_vllm_names_match_and_shortest_name_wins():
    samples = parse_prometheus_text(VLLM_BEFORE)
    assert find_metric(samples, COUNTERS["prefix_cache_hits"]) == "vllm:prefix_cache_hits_total"
    assert find_metric(samples, COUNTERS["num_preemptions"]) == "vllm:num_preemptions_total"
    assert gauge_max(samples, "kv_cache_usage") == (0.75, "vllm:kv_cache_usage_perc")


def test_counter_deltas_sum_label_sets():
    after = VLLM_BEFORE.replace("} 100.0", "} 160.0").replace("} 400.0", "} 480.0").replace("} 1.0", "} 3.0")
    deltas, names = counter_deltas(parse_prometheus_text(VLLM_BEFORE), parse_prometheus_text(after))
    assert deltas == {"prefix_cache_hits": 60.0, "prefix_cache_queries": 80.0, "num_preemptions": 2.0}
    assert names["prefix_cache_queries"] == "vllm:prefix_cache_queries_total"


@pytest.mark.parametrize(
    "text, key, name",
    [
        ("pagedserve_prefix_cache_hits_total 3", "prefix_cache_hits", "pagedserve_prefix_cache_hits_total"),
        ("pagedserve_num_preemptions_total 0", "num_preemptions", "pagedserve_num_preemptions_total"),
        ("vllm:gpu_prefix_cache_hits_total 1", "prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"),
    ],
)
def test_other_server_names(text, key, name):
    assert find_metric(parse_prometheus_text(text), COUNTERS[key]) == name


@pytest.mark.parametrize(
    "text, expected",
    [
        ("pagedserve_kv_cache_usage_ratio 0.5", (0.5, "pagedserve_kv_cache_usage_ratio")),
        ('vllm:gpu_cache_usage_perc{model_name="m"} 0.125', (0.125, "vllm:gpu_cache_usage_perc")),
        ("llamacpp:kv_cache_usage_ratio 0.3", (0.3, "llamacpp:kv_cache_usage_ratio")),
        ("process_cpu_seconds_total 3", None),
    ],
)
def test_kv_usage_gauge_names(text, expected):
    assert gauge_max(parse_prometheus_text(text), "kv_cache_usage") == expected


def test_missing_counters_are_absent_not_zero():
    deltas, names = counter_deltas({}, parse_prometheus_text("pagedserve_prefix_cache_hits_total 5"))
    assert deltas == {"prefix_cache_hits": 5.0}
    assert names == {"prefix_cache_hits": "pagedserve_prefix_cache_hits_total"}


def test_text_that_is_not_the_prometheus_format_is_refused():
    with pytest.raises(ValueError):
        parse_prometheus_text("<html><body>Not Found</body></html>")


def _spec_exposition(counters) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from pagedserve.services.scheduler.spec_decode.metrics import SpecDecodeCollector

    registry = CollectorRegistry()
    registry.register(SpecDecodeCollector(lambda: (counters, "m")))
    return generate_latest(registry).decode()


def test_speculative_counters_and_acceptance_by_position_from_the_scheduler_exposition():
    """Deltas of the scheduler's own exposition: drafts, tokens, and per position accepted / drafts verified."""
    from pagedserve.benchmarks.prometheus import acceptance_by_position
    from pagedserve.services.scheduler.spec_decode.counters import SpecDecodeCounters

    counters = SpecDecodeCounters()
    counters.record(4, 4)
    before = parse_prometheus_text(_spec_exposition(counters))
    for accepted in (4, 2, 0, 1):
        counters.record(4, accepted)
    after = parse_prometheus_text(_spec_exposition(counters))
    deltas, _ = counter_deltas(before, after)
    assert deltas["spec_decode_num_drafts"] == 4
    assert deltas["spec_decode_num_draft_tokens"] == 16
    assert deltas["spec_decode_num_accepted_tokens"] == 7
    assert acceptance_by_position(before, after, deltas["spec_decode_num_drafts"]) == [0.75, 0.5, 0.25, 0.25]


def test_no_acceptance_by_position_without_speculation():
    from pagedserve.benchmarks.prometheus import acceptance_by_position

    samples = parse_prometheus_text(VLLM_BEFORE)
    assert acceptance_by_position(samples, samples, None) is None
    assert "spec_decode_num_drafts" not in counter_deltas(samples, samples)[0]
