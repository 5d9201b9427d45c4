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
