"""Admission: the open-request cap (429), draining (503), both with Retry-After; the drain's stop logic."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import uvicorn
from prometheus_client import CollectorRegistry, Counter

from pagedserve.services.gateway.http.admission import Admission, AdmissionGate
from pagedserve.services.gateway.http.drain import DrainingServer
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.shared.drain_timing import CUT_GRACE_S
from tests.unit.gateway.test_app import CHAT, gateway_with_state


async def call(app, path: str, method: str = "POST", body_read: list | None = None
               ) -> tuple[int, dict[str, str], dict | None]:
    """Run one request through an ASGI app: (status, headers, JSON body or None); `body_read` gets an item each time
    the app reads the request body."""
    messages = []

    async def receive():
        if body_read is not None:
            body_read.append(True)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, json.loads(body) if body.startswith(b"{") else None


def held_app(release: asyncio.Event):
    """An app whose responses wait for `release`."""
    async def app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
    return app


def test_requests_over_the_cap_get_429_with_retry_after_and_the_count_returns_to_zero():
    async def main():
        release, admission = asyncio.Event(), Admission(max_open_requests=2)
        gate = AdmissionGate(held_app(release), admission)
        held = [asyncio.create_task(call(gate, path)) for path in ("/v1/completions", "/tokenize")]
        while admission.num_open < 2:
            await asyncio.sleep(0)
        status, headers, body = await call(gate, "/v1/chat/completions")
        assert (status, headers["retry-after"]) == (429, "1")
        assert (body["error"]["type"], body["error"]["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        release.set()
        assert [s for s, _, _ in await asyncio.gather(*held)] == [200, 200]
        assert admission.num_open == 0
        assert (await call(gate, "/v1/chat/completions"))[0] == 200

    asyncio.run(main())


def test_while_every_replica_refuses_generation_is_shed_unread_and_counted():
    async def main():
        refusing = {"s": 0.3}
        admission = Admission(max_open_requests=8, refusing_for_s=lambda: refusing["s"])
        shed = Counter("shed", "test", registry=CollectorRegistry())
        gate = AdmissionGate(held_app(asyncio.Event()), admission, shed_counter=shed)
        status, headers, body = await call(gate, "/v1/chat/completions", body_read=(read := []))
        assert (status, headers["retry-after"], body["error"]["code"]) == (429, "1", "rate_limit_exceeded")
        assert read == [] and shed._value.get() == 1 and admission.num_open == 0  # its body was never read
        assert (await call(gate, "/v1/completions"))[0] == 429
        open_gate = AdmissionGate(held_app(released()), admission, shed_counter=shed)
        assert (await call(open_gate, "/tokenize"))[0] == 200  # not generation: not shed
        refusing["s"] = 0.0
        assert (await call(open_gate, "/v1/completions"))[0] == 200
        assert shed._value.get() == 2

    asyncio.run(main())


def released() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def test_reads_are_not_capped():
    async def main():
        release, admission = asyncio.Event(), Admission(max_open_requests=1)
        gate = AdmissionGate(held_app(release), admission)
        held = asyncio.create_task(call(gate, "/v1/completions"))
        while admission.num_open < 1:
            await asyncio.sleep(0)
        release.set()  # /health, /metrics, /v1/models pass though the cap is reached
        assert [(await call(gate, p, "GET"))[0] for p in ("/health", "/metrics", "/v1/models")] == [200] * 3
        await held

    asyncio.run(main())


def test_draining_refuses_new_work_and_readiness_but_stays_live(tokenizer):
    with gateway_with_state(tokenizer) as (client, fake, serving):
        serving.admission.draining = True
        health = client.get("/health")
        livez = client.get("/livez")
        refused = client.post("/v1/chat/completions", json=CHAT)
        metrics = client.get("/metrics")
    assert livez.status_code == 200 and metrics.status_code == 200
    for response in (health, refused):
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        assert response.json()["error"]["code"] == "service_unavailable"
    assert refused.headers["connection"] == "close" and fake.requests == []


def _server(admission: Admission, drain_timeout_s: float) -> DrainingServer:
    return DrainingServer(uvicorn.Config(app=None), admission, drain_timeout_s)


def test_sigterm_drains_and_exits_without_re_raising_the_signal():
    """uvicorn's own handler stops at once and re-raises SIGTERM after shutdown (exit code 143)."""
    admission = Admission(8)
    server = _server(admission, drain_timeout_s=60)
    admission.num_open = 2
    server.handle_exit(signal.SIGTERM, None)
    assert admission.draining and not server.should_exit and server._captured_signals == []
    server._drain_step()
    assert not server.should_exit  # requests in flight: keep serving them
    admission.num_open = 0
    server._drain_step()
    assert server.should_exit and not server.force_exit


def test_the_drain_deadline_cuts_what_runs_then_stops():
    async def main():
        admission = Admission(8)
        server = _server(admission, drain_timeout_s=0)
        cut = admission.cut_signal()
        admission.num_open = 1
        server.handle_exit(signal.SIGTERM, None)
        server._drain_step()
        error = cut.result()
        assert isinstance(error, OpenAIError) and error.status == 503 and not server.should_exit
        server.cut_at_s = time.monotonic() - CUT_GRACE_S  # the cut's answers had their time
        server._drain_step()
        assert server.should_exit

    asyncio.run(main())


def test_a_second_ctrl_c_stops_at_once():
    admission = Admission(8)
    server = _server(admission, drain_timeout_s=60)
    admission.num_open = 1
    server.handle_exit(signal.SIGINT, None)
    assert not server.should_exit
    server.handle_exit(signal.SIGTERM, None)  # a repeated SIGTERM changes nothing
    assert not server.should_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.should_exit and server.force_exit
