"""SIGTERM on the scheduler with streams in flight: it stops taking requests (503 with Retry-After, /health 503),
every stream in flight finishes with [DONE] and no error, and it exits 0 before its worker is touched."""

from __future__ import annotations

import signal
import time

from tests.faults.clients import chat_body, join, start_streams

STORY = chat_body("Tell me a story about a lighthouse.", max_tokens=48, ignore_eos=True)


def test_sigterm_on_the_scheduler_finishes_all_eight_streams_and_exits_0(healthy):
    stack = healthy
    threads, results = start_streams(stack, 8, STORY)
    stack.scheduler.signal(signal.SIGTERM)
    sent_s = time.monotonic()
    stack.wait_health(503, 5)
    refused = stack.http.post("/v1/chat/completions", json=STORY)
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.text
    join(threads, 120)
    for result in results:
        assert result.status == 200 and result.done and result.error is None and result.text, result
    assert stack.scheduler.wait(30) == 0, stack.scheduler.log_tail()
    print(f"FIGURE scheduler SIGTERM: 8/8 streams finished, exit 0 after {time.monotonic() - sent_s:.2f}s")
    assert stack.worker.running  # the worker keeps serving: it is stopped after its scheduler, if at all
    stack.restart_scheduler()
