"""Finding 6 and the drain, on real processes: SIGTERM on a gateway with 8 streams in flight stops it taking work
(/health 503, new requests 503, both with Retry-After; /livez 200), lets all 8 finish normally and exits 0. Streams
still running at --drain-timeout-s end with an OpenAI-shaped error event and [DONE], and their KV blocks are freed.
Before: streams cut mid-body after a hard-coded 5 s, no error event, no [DONE], exit 143."""

from __future__ import annotations

import signal

import httpx

from tests.faults.gateway.clients import Streams
from tests.faults.gateway.stack import AUTH
from tests.integration.processes import wait_for

SHORT = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 16, "ignore_eos": True,
         "temperature": 0.0}
# long enough that 8 started together all run at once (16 tokens took ~0.3 s each: the first could end before the
# last began); far shorter than the drain timeout
DRAINED = {**SHORT, "max_tokens": 128}
LONG = {**SHORT, "max_tokens": 1500}  # far longer than the drain timeout below allows


def _wait_running(stack, count: int) -> None:
    wait_for(lambda: stack.stats().num_running == count, 120, interval_s=0.1, what=f"{count} streams running")


def test_sigterm_lets_eight_streams_finish_then_exits_0(quiescent):
    gateway = quiescent.start_gateway("--drain-timeout-s", "300", name="drain")
    streams = Streams(gateway.base_url, DRAINED, 8)
    _wait_running(quiescent, 8)
    gateway.process.send_signal(signal.SIGTERM)
    wait_for(lambda: httpx.get(gateway.base_url + "/health", timeout=10).status_code == 503, 30,
             what="/health 503 while draining")
    health = httpx.get(gateway.base_url + "/health", timeout=10)
    refused = httpx.post(gateway.base_url + "/v1/chat/completions", json=SHORT, headers=AUTH, timeout=10)
    live = httpx.get(gateway.base_url + "/livez", timeout=10)
    results = streams.join(300)
    assert gateway.process.wait(60) == 0, gateway.log_tail()
    assert int(health.headers["retry-after"]) >= 1 and live.status_code == 200
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["code"] == "service_unavailable"
    assert [(r.status, r.done, r.error, r.finish_reason) for r in results] == [(200, True, None, "length")] * 8


def test_streams_past_the_drain_timeout_end_with_an_error_event_and_done(quiescent):
    gateway = quiescent.start_gateway("--drain-timeout-s", "2", name="drain-cut")
    streams = Streams(gateway.base_url, LONG, 3)
    streams.wait_started(120)  # a request cut before its response began gets a JSON 503 instead (unit-tested)
    gateway.process.send_signal(signal.SIGTERM)
    results = streams.join(120)
    assert gateway.process.wait(60) == 0, gateway.log_tail()
    for result in results:
        assert result.status == 200 and result.done and result.finish_reason is None
        assert result.error["code"] == "service_unavailable" and "drain timeout" in result.error["message"]
    quiescent.wait_quiescent(30)  # the cut requests were aborted: their blocks are back
