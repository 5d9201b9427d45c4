"""Streaming clients for the gateway's fault cases: each keeps what a user would see (text, error event, [DONE])."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import httpx

from tests.faults.gateway.stack import AUTH


@dataclass
class StreamResult:
    status: int
    text: str = ""
    error: dict | None = None  # a JSON error body, or the `error` event inside the stream
    done: bool = False  # the stream ended with data: [DONE]
    finish_reason: str | None = None
    headers: dict = field(default_factory=dict)


def stream_chat(base_url: str, body: dict, timeout_s: float = 300,
                on_first_event: threading.Semaphore | None = None) -> StreamResult:
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=timeout_s) as http, \
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        result = StreamResult(response.status_code, headers=dict(response.headers))
        if response.status_code != 200:
            result.error = json.loads(response.read())["error"]
            return result
        for line in response.iter_lines():
            if line == "data: [DONE]":
                result.done = True
            elif line.startswith("data: "):
                if on_first_event is not None and not (result.text or result.error):
                    on_first_event.release()
                    on_first_event = None
                event = json.loads(line[len("data: "):])
                result.error = event.get("error", result.error)
                for choice in event.get("choices", []):
                    result.text += choice["delta"].get("content") or ""
                    result.finish_reason = choice.get("finish_reason") or result.finish_reason
    return result


class Streams:
    """`count` streams run in threads; `results` fills as they end."""

    def __init__(self, base_url: str, body: dict, count: int) -> None:
        self.results: list[StreamResult] = []
        self.started = threading.Semaphore(0)  # released once per stream at its first event
        self.threads = [threading.Thread(target=lambda: self.results.append(
            stream_chat(base_url, body, on_first_event=self.started)), daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def wait_started(self, timeout_s: float) -> None:
        """Until every stream has had its first event (its response has begun)."""
        for _ in self.threads:
            assert self.started.acquire(timeout=timeout_s), f"a stream had no event within {timeout_s}s"

    def join(self, timeout_s: float) -> list[StreamResult]:
        for thread in self.threads:
            thread.join(timeout_s)
        assert not any(t.is_alive() for t in self.threads), f"a stream still runs after {timeout_s}s"
        return self.results
