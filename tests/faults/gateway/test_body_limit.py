"""Finding 3 against a real gateway: 10 MB and 50 MB bodies, declared or chunked, get an OpenAI-shaped 413 while
/health keeps answering, and the gateway's memory stays where it was (it grew from 448 MB to 7.1 GB before)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.faults.gateway.stack import AUTH

LIMIT_BYTES = 4 * 1024**2  # the default --max-body-bytes
MAX_RSS_GROWTH_BYTES = 64 * 1024**2


def chat_body(num_bytes: int) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "word " * (num_bytes // 5)}],
                       "max_tokens": 1}).encode()


class HealthProbe:
    """GET /health in a loop while a big body is sent: every answer must be 200."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.statuses, self.latencies_s = base_url, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            while not self._stop.is_set():
                start_s = time.perf_counter()
                self.statuses.append(client.get("/health").status_code)
                self.latencies_s.append(time.perf_counter() - start_s)
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        while not self.statuses:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


@pytest.fixture(scope="module")
def gateway(gateway_stack):
    gateway = gateway_stack.start_gateway(name="body-limit")
    yield gateway
    assert gateway.stop(strict=True) == 0


@pytest.mark.parametrize("size_mb", [10, 50])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_big_bodies_get_413_and_memory_stays_bounded(gateway, size_mb, framing):
    body = chat_body(size_mb * 1024**2)
    before = gateway.rss_bytes()
    content = body if framing == "content-length" else (body[i:i + 65536] for i in range(0, len(body), 65536))
    with HealthProbe(gateway.base_url) as probe:
        start_s = time.perf_counter()
        response = httpx.post(gateway.base_url + "/v1/chat/completions", content=content, timeout=120,
                              headers={**AUTH, "content-type": "application/json"})
        elapsed_s = time.perf_counter() - start_s
    after = gateway.rss_bytes()
    print(f"\n{size_mb} MB {framing}: {response.status_code} in {elapsed_s:.2f} s; /health max "
          f"{max(probe.latencies_s) * 1000:.0f} ms over {len(probe.statuses)}; RSS {before / 2**20:.0f} -> "
          f"{after / 2**20:.0f} MiB")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert set(probe.statuses) == {200}
    assert after - before < MAX_RSS_GROWTH_BYTES


def test_a_chunked_body_is_refused_while_it_still_arrives(gateway):
    """The 413 comes once the limit is passed, though the client has not finished (or even ended) its body."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=60) as client:
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                       b"Authorization: " + AUTH["Authorization"].encode() + b"\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(LIMIT_BYTES // len(chunk) + 1):
            client.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += client.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413 ")
