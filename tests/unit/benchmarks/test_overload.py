"""The overload run's verdict: outcomes sorted into 200 / 429 (with or without Retry-After) / 5xx / hung, and the
accepted requests' TTFT against the unloaded one."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from pagedserve.benchmarks.overload import (
    Outcome,
    OverloadReport,
    cpu_s,
    measure_capacity,
    scheduler_means_ms,
    summarize,
)
from pagedserve.benchmarks.prometheus import parse_prometheus_text


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


def _scrape(ttft_sum: float, ttft_count: int, steps: int, step_s: float, tokens: int) -> dict:
    return parse_prometheus_text(
        f'pagedserve_time_to_first_token_seconds_sum{{model_name="m"}} {ttft_sum}\n'
        f'pagedserve_time_to_first_token_seconds_count{{model_name="m"}} {ttft_count}\n'
        f'pagedserve_request_queue_time_seconds_sum{{model_name="m"}} {ttft_sum / 2}\n'
        f'pagedserve_request_queue_time_seconds_count{{model_name="m"}} {ttft_count}\n'
        f'pagedserve_engine_steps_total{{model_name="m"}} {steps}\n'
        f'pagedserve_worker_step_seconds_total{{model_name="m"}} {step_s}\n'
        f'pagedserve_scheduled_tokens_total{{model_name="m"}} {tokens}\n')


def test_scheduler_means_cover_the_interval_between_the_scrapes_only():
    before, after = _scrape(10.0, 100, 1000, 20.0, 5000), _scrape(13.0, 150, 1100, 22.5, 5900)
    means = scheduler_means_ms(before, after)
    assert means == pytest.approx({"ttft": 60.0, "queue": 30.0, "worker_step": 25.0, "tokens_per_step": 9.0})
    assert scheduler_means_ms({}, {}) == {}  # no metrics URL: nothing to report


STREAM_S = 0.5


def test_capacity_counts_whole_streams_only_and_a_run_without_one_fails():
    """Quick 429s of the closed loop are no capacity: 2 of 4 requests streamed, so the rate is 2 / elapsed."""
    calls = []

    async def chat(request: web.Request) -> web.StreamResponse:
        calls.append(request)
        if len(calls) % 2 or refuse_all:
            return web.json_response({"error": {"message": "busy"}}, status=429, headers={"Retry-After": "1"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(STREAM_S)
        await response.write(b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n')
        return response

    async def main() -> float:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        async with TestServer(app) as server, aiohttp.ClientSession() as session:
            return await measure_capacity(session, str(server.make_url("")).rstrip("/"), 2, 4, 4)

    refuse_all = False
    rate = asyncio.run(main())
    # 2 streams in at least STREAM_S: at most 2 / STREAM_S a second (counting the 429s too would give about twice)
    assert len(calls) == 4 and 2 / (20 * STREAM_S) < rate <= 2 / STREAM_S
    refuse_all, calls = True, []
    with pytest.raises(RuntimeError, match="no request of the capacity run completed"):
        asyncio.run(main())


def test_cpu_seconds_grow_with_work():
    """/proc counts in clock ticks (10 ms): 0.2 s of work reads 0.19 s at least."""
    before = cpu_s("self")
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert cpu_s("self") - before > 0.185
