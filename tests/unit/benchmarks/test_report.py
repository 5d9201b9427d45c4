"""The terminal table's server-metrics rows: counts as they are, 0-1 fractions as percentages."""

from pagedserve.benchmarks.metrics import MetricsConfig, compute_metrics
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.report import run_table


def _run(server_metrics: dict | None) -> dict:
    record = RequestRecord(
        index=0,
        num_requested_output_tokens=3,
        num_prompt_tokens=10,
        chunk_times_s=[0.1, 0.2, 0.3],
        e2el_s=0.3,
        num_output_tokens=3,
    )
    metrics = compute_metrics([record], 0.3, MetricsConfig())
    return {"label": "max_concurrency=1", "metrics": metrics, "server_metrics": server_metrics, "requests": []}


def _value(table: str, title: str) -> str:
    line = next(line for line in table.splitlines() if line.startswith(title + ":"))
    return line[len(title) + 1 :].strip()


def test_fractions_print_as_percentages_and_counts_as_counts():
    server = {
        "prefix_cache_hits": 4992.0,
        "prefix_cache_queries": 5256.0,
        "prefix_cache_hit_rate": 4992 / 5256,
        "num_preemptions": 0.0,
        "kv_cache_usage_peak": 0.0042,
    }
    table = run_table(_run(server))
    assert _value(table, "KV cache usage peak (%)") == "0.4"
    assert _value(table, "Prefix cache hit rate (%)") == "95.0"
    assert _value(table, "Prefix cache hits (delta)") == "4992.00"
    assert _value(table, "Preemptions (delta)") == "0.00"


def test_a_metric_the_server_does_not_expose_prints_a_dash():
    table = run_table(_run({"prefix_cache_hits": 3.0}))
    assert _value(table, "KV cache usage peak (%)") == "-"
    assert _value(table, "Prefix cache hit rate (%)") == "-"


def test_no_server_metrics_no_section():
    assert "Server metrics" not in run_table(_run(None))
