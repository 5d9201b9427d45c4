"""The overload run's verdict: outcomes sorted into 200 / 429 (with or without Retry-After) / 5xx / hung, and the
accepted requests' TTFT against the unloaded one."""

from __future__ import annotations

import pytest

from benchmarks.overload import Outcome, OverloadReport, summarize


def test_outcomes_are_counted_by_kind_and_ttft_is_compared_with_the_unloaded_one():
    outcomes = [Outcome(200, ttft_s=0.2), Outcome(200, ttft_s=0.4), Outcome(200, ttft_s=0.3, error="worker lost"),
                Outcome(429, retry_after="2"), Outcome(429), Outcome(503, retry_after="1"), Outcome(0, error="hung"),
                Outcome(400)]
    report = summarize(OverloadReport(capacity_rps=2.0, offered_rps=8.0, duration_s=1.0, unloaded_ttft_p50_s=0.1),
                       outcomes)
    assert (report.num_requests, report.num_ok, report.num_stream_errors, report.num_429,
            report.num_429_with_retry_after, report.num_5xx, report.num_hung, report.num_other) == (8, 3, 1, 2, 1, 1,
                                                                                                 1, 1)
    assert report.accepted_ttft_p50_s == pytest.approx(0.3) and report.ttft_ratio == pytest.approx(3.0)
