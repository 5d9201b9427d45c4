import math

import numpy as np
import pytest

from pagedserve.benchmarks.metrics import (
    MetricsConfig,
    compute_metrics,
    latency_percentiles_ms,
    latency_samples_ms,
    max_in_flight,
    meets_slos,
    summarize_ms,
)
from pagedserve.benchmarks.records import RequestRecord


def record(index: int, chunk_times_s: list[float], e2el_s: float, num_output_tokens: int, **kw) -> RequestRecord:
    return RequestRecord(
        index=index,
        num_requested_output_tokens=kw.pop("requested", num_output_tokens),
        num_prompt_tokens=kw.pop("prompt", 100),
        chunk_times_s=chunk_times_s,
        e2el_s=e2el_s,
        num_output_tokens=num_output_tokens,
        **kw,
    )


def failed(index: int, kind: str) -> RequestRecord:
    return RequestRecord(index=index, num_requested_output_tokens=10, error=kind, e2el_s=0.5)


def test_summarize_matches_numpy_linear_percentiles():
    values = [float(v) for v in range(1, 101)]  # 1..100
    stats = summarize_ms(values, (90.0, 99.0, 99.9))
    assert stats["mean"] == 50.5
    assert stats["median"] == 50.5
    assert stats["std"] == pytest.approx(np.std(values))
    assert stats["p90"] == pytest.approx(90.1)  # rank 0.9 * 99 = 89.1 -> 90 + 0.1 * (91 - 90)
    assert stats["p99"] == pytest.approx(99.01)
    assert stats["p99.9"] == pytest.approx(99.901)


def test_summarize_empty_is_all_none():
    assert summarize_ms([], (99.0,)) == {"mean": None, "median": None, "std": None, "p99": None}


def test_tpot_excludes_first_token_and_itl_is_chunk_gaps():
    r = record(0, [0.100, 0.120, 0.150, 0.160], e2el_s=0.400, num_output_tokens=7)
    assert r.ttft_s == 0.100
    assert r.tpot_s == pytest.approx((0.400 - 0.100) / 6)
    assert r.itls_s == pytest.approx([0.020, 0.030, 0.010])


def test_tpot_is_none_for_single_token_and_failed_requests():
    assert record(0, [0.1], e2el_s=0.1, num_output_tokens=1).tpot_s is None
    assert failed(1, "http_500").tpot_s is None


def test_samples_pool_itl_over_requests_and_skip_failures():
    records = [
        record(0, [0.1, 0.2, 0.4], e2el_s=0.5, num_output_tokens=3),
        record(1, [0.3, 0.35], e2el_s=0.4, num_output_tokens=2),
        failed(2, "timeout"),
    ]
    samples = latency_samples_ms(records)
    assert samples["ttft"] == pytest.approx([100.0, 300.0])
    assert samples["itl"] == pytest.approx([100.0, 200.0, 50.0])
    assert samples["tpot"] == pytest.approx([200.0, 100.0])  # (500-100)/2, (400-300)/1
    assert samples["e2el"] == pytest.approx([500.0, 400.0])


def test_goodput_counts_requests_meeting_every_slo():
    fast = record(0, [0.05, 0.06], e2el_s=0.07, num_output_tokens=3)  # tpot 10 ms
    slow_first = record(1, [0.30, 0.31], e2el_s=0.32, num_output_tokens=3)  # ttft 300 ms
    slow_decode = record(2, [0.05, 0.5], e2el_s=1.05, num_output_tokens=3)  # tpot 500 ms
    single = record(3, [0.05], e2el_s=0.05, num_output_tokens=1)  # no tpot: passes the tpot SLO
    slos = {"ttft": 100.0, "tpot": 50.0}
    assert [meets_slos(r, slos) for r in (fast, slow_first, slow_decode, single)] == [True, False, False, True]
    assert not meets_slos(failed(4, "http_500"), slos)
    metrics = compute_metrics([fast, slow_first, slow_decode, single], 2.0, MetricsConfig(goodput_slos_ms=slos))
    assert metrics["num_good"] == 2
    assert metrics["request_goodput_rps"] == 1.0


def test_throughput_tokens_and_failures_by_kind():
    records = [
        record(0, [0.1, 0.2], e2el_s=0.3, num_output_tokens=10, prompt=100),
        record(1, [0.1, 0.2], e2el_s=0.3, num_output_tokens=6, prompt=50, requested=10),
        failed(2, "http_500"),
        failed(3, "http_500"),
        failed(4, "incomplete_stream"),
    ]
    m = compute_metrics(records, 4.0, MetricsConfig(percentiles=(99.0,)))
    assert (m["completed"], m["failed"], m["num_requests"]) == (2, 3, 5)
    assert m["failures"] == {"http_500": 2, "incomplete_stream": 1}
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (150, 16)
    assert m["request_throughput_rps"] == 0.5
    assert m["output_throughput_tok_s"] == 4.0
    assert m["total_token_throughput_tok_s"] == (150 + 16) / 4.0
    assert m["num_short_outputs"] == 1
    assert "request_goodput_rps" not in m
    assert m["p99_ttft_ms"] == pytest.approx(100.0)
    assert "p90_ttft_ms" not in m


def test_percentile_metrics_selects_reported_metrics():
    m = compute_metrics([record(0, [0.1], 0.1, 1)], 1.0, MetricsConfig(percentile_metrics=("ttft",)))
    assert [k for k in m if k.endswith("_ms")] == [
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p90_ttft_ms",
        "p95_ttft_ms",
        "p99_ttft_ms",
    ]


def test_latency_percentiles_report_p50_to_p99():
    records = [record(i, [i / 1000], e2el_s=i / 1000, num_output_tokens=1) for i in range(1, 102)]
    pcts = latency_percentiles_ms(records)
    assert pcts["ttft"] == pytest.approx({"p50": 51.0, "p90": 91.0, "p99": 100.0})
    assert pcts["tpot"] == {"p50": None, "p90": None, "p99": None}


def test_max_in_flight():
    records = [
        record(0, [0.1], e2el_s=1.0, num_output_tokens=1, send_offset_s=0.0),
        record(1, [0.1], e2el_s=1.0, num_output_tokens=1, send_offset_s=0.5),
        record(2, [0.1], e2el_s=1.0, num_output_tokens=1, send_offset_s=1.0),  # starts as the first ends
        record(3, [0.1], e2el_s=0.2, num_output_tokens=1, send_offset_s=1.6),
    ]
    assert max_in_flight(records) == 2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"percentile_metrics": ("ttft", "latency")},
        {"percentiles": (100.0,)},
        {"goodput_slos_ms": {"itl": 5.0}},
        {"goodput_slos_ms": {"ttft": -1.0}},
        {"goodput_slos_ms": {"ttft": math.nan}},
    ],
)
def test_metrics_config_rejects_bad_flags(kwargs):
    with pytest.raises(ValueError):
        MetricsConfig(**kwargs)
