"""A worker that stops answering without dying (SIGSTOP, as a deadlock or a swapped-out host would): /health goes
503 within the configured time, requests in flight get an error instead of hanging, and everything recovers by
itself once the worker runs again (SIGCONT), with no restart of scheduler or gateway."""

from __future__ import annotations

import signal
import time

from tests.faults.clients import DRAGONS, answer, join, start_streams
from tests.support.fault_stack import WORKER_PROBE_TIMEOUT_S

DETECTION_BOUND_S = WORKER_PROBE_TIMEOUT_S + 5.0  # a probe's interval and deadline, the gateway's health poll, load


def test_a_stopped_busy_worker_fails_its_streams_and_health_within_the_probe_timeout(healthy):
    stack = healthy
    reference, _ = answer(stack, DRAGONS)
    threads, results = start_streams(stack, 2)
    stack.worker.signal(signal.SIGSTOP)
    stopped_s = time.monotonic()
    try:
        stack.wait_health(503, DETECTION_BOUND_S)
        unhealthy_after_s = time.monotonic() - stopped_s
        join(threads, 10)
        for result in results:  # a 200 with tokens, then the error event and [DONE]: nothing hangs
            assert result.status == 200 and result.done and result.error is not None, result
        assert stack.http.post("/v1/chat/completions", json=DRAGONS).status_code == 503
    finally:
        stack.worker.signal(signal.SIGCONT)
    print(f"FIGURE SIGSTOP busy: /health 503 after {unhealthy_after_s:.2f}s (probe timeout "
          f"{WORKER_PROBE_TIMEOUT_S}s); 200 again {stack.wait_health(200, 60):.2f}s after SIGCONT")
    assert answer(stack, DRAGONS)[0] == reference
    assert unhealthy_after_s <= DETECTION_BOUND_S


def test_a_stopped_idle_worker_is_noticed_by_the_probes(healthy):
    stack = healthy
    stack.worker.signal(signal.SIGSTOP)
    try:
        took_s = stack.wait_health(503, DETECTION_BOUND_S)
    finally:
        stack.worker.signal(signal.SIGCONT)
    print(f"FIGURE SIGSTOP idle: /health 503 after {took_s:.2f}s; 200 again {stack.wait_health(200, 60):.2f}s "
          "after SIGCONT")
    assert took_s <= DETECTION_BOUND_S
    assert answer(stack, DRAGONS)[0]
