"""A client that goes away aborts its request: within a second the scheduler holds no blocks for it."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.processes import wait_for

LONG = {"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}], "max_tokens": 400,
        "ignore_eos": True, "temperature": 0.0}


def assert_released(stack, scheduler_stats, req_id: str, baseline_usage: float) -> float:
    """Seconds until GetStats and Redis both show the request gone and KV usage back to the baseline."""
    start_s = time.monotonic()

    def stats_released() -> bool:
        stats = scheduler_stats()
        return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_usage == baseline_usage

    wait_for(stats_released, 1.0, what="GetStats: no request running and KV usage back to the baseline")
    redis = stack.redis.client()
    wait_for(lambda: redis.hget(stack.redis_key(f"request:{req_id}"), "finish_reason") == "abort", 1.0,
             what="Redis: the request recorded as aborted")
    wait_for(lambda: float(redis.hget(stack.redis_key("stats"), "kv_usage")) == baseline_usage, 1.0,
             what="Redis: kv_usage back to the baseline")
    assert redis.hget(stack.redis_key(f"request:{req_id}"), "status") == "finished"
    return time.monotonic() - start_s


@pytest.fixture
def baseline_usage(scheduler_stats) -> float:
    stats = scheduler_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0, "another request is still running"
    return stats.kv_usage


def test_dropped_stream_aborts_within_a_second(stack, scheduler_stats, baseline_usage):
    req_id = "dropped-stream"
    with httpx.Client(base_url=stack.base_url, timeout=60) as http, http.stream(
            "POST", "/v1/chat/completions", json={**LONG, "stream": True}, headers={"X-Request-Id": req_id}
    ) as response:
        lines = response.iter_lines()
        num_content = 0
        while num_content < 3:
            num_content += '"content"' in next(lines)
        assert scheduler_stats().num_running == 1 and scheduler_stats().kv_usage > baseline_usage
    assert_released(stack, scheduler_stats, req_id, baseline_usage)  # closed the connection mid-stream


def test_dropped_non_streaming_request_aborts_too(stack, scheduler_stats, baseline_usage):
    req_id = "dropped-whole"
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=stack.base_url, timeout=1.0) as http:
        http.post("/v1/chat/completions", json=LONG, headers={"X-Request-Id": req_id})
    assert_released(stack, scheduler_stats, req_id, baseline_usage)
