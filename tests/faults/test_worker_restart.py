"""A worker killed or restarted behind the scheduler: streams in flight get an error and [DONE] within seconds,
/health says 503 while it is gone, and once it is back every answer is the right one (no stale prefix cache, no
block id past a smaller pool), with no restart of scheduler or gateway and no leaked block."""

from __future__ import annotations

import signal
import time

from tests.faults.clients import DRAGONS, answer, join, start_streams


def test_killed_worker_fails_streams_at_once_and_no_restart_serves_a_wrong_answer(healthy):
    """A kill -9 mid-stream, a smaller worker back, then a restart while idle: the same greedy answer each time."""
    stack = healthy
    reference, _ = answer(stack, DRAGONS)
    cached_answer, num_cached = answer(stack, DRAGONS)
    assert cached_answer == reference and num_cached > 0  # the second time the prompt hits the prefix cache
    before = stack.integrity()
    threads, results = start_streams(stack, 4)
    stack.worker.signal(signal.SIGKILL)
    killed_s = time.monotonic()
    join(threads, 30)
    streams_ended_s = time.monotonic() - killed_s
    assert streams_ended_s < 10, f"streams took {streams_ended_s:.1f}s to end"
    print(f"FIGURE kill -9: 4 streams ended (error event + [DONE]) {streams_ended_s:.2f}s after the kill")
    for result in results:  # the first tokens went out with a 200: the error comes as an event, then [DONE]
        assert result.status == 200 and result.done and result.text, result
        assert result.error is not None and result.error["type"] == "server_error", result
    print(f"FIGURE kill -9: /health 503 {stack.wait_health(503, 5) + streams_ended_s:.2f}s after the kill")
    refused = stack.http.post("/v1/chat/completions", json=DRAGONS)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "service_unavailable"

    stack.worker.wait(10)
    stack.restart_worker("--kv-cache-memory-bytes", "64MiB", "--max-model-len", "2048")
    after = stack.integrity()
    assert after.worker_incarnation_id != before.worker_incarnation_id
    assert after.num_blocks < before.num_blocks and stack.stats().num_kv_blocks == after.num_blocks
    text, num_cached_after = answer(stack, DRAGONS)  # its own blocks computed afresh on the new worker
    assert text == reference and num_cached_after < num_cached  # (the chat template's start was, by warm-up)
    assert answer(stack, DRAGONS) == (reference, num_cached)
    assert stack.http.get("/v1/models").json()["data"][0]["max_model_len"] == 2048  # the gateway re-described

    # the repro, on the way back to the standard worker for the other tests: restart the worker while
    # idle, then send a prompt the old one had cached
    assert answer(stack, DRAGONS) == (reference, num_cached)
    old = stack.integrity().worker_incarnation_id
    stack.worker.signal(signal.SIGTERM)
    assert stack.worker.wait(30) == 0
    stack.wait_health(503, 5)
    stack.restart_worker()
    assert stack.integrity().worker_incarnation_id != old
    text, num_cached_after = answer(stack, DRAGONS)
    assert text == reference and num_cached_after < num_cached
