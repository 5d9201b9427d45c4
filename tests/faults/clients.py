"""What the fault tests send: greedy chat bodies, a streaming reader that keeps the error event and [DONE], and
streams run in threads while a fault is injected."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

import httpx

from tests.integration.processes import wait_for
from tests.support.fault_stack import FaultStack


def chat_body(content: str, max_tokens: int = 24, **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0.0,
            **extra}


@dataclass
class StreamResult:
    status: int = 0  # 0 until the response's status line came
    text: str = ""
    error: dict | None = None  # the OpenAI error object (a JSON body, or an `error` event inside a stream)
    done: bool = False  # the stream ended with data: [DONE]
    headers: dict = field(default_factory=dict)


def stream_chat(base_url: str, body: dict, timeout_s: float = 120, result: StreamResult | None = None
                ) -> StreamResult:
    """POST a streaming chat request and read it to the end into `result` (filled as it comes, so that another
    thread can watch the text grow)."""
    result = result or StreamResult()
    with httpx.Client(base_url=base_url, timeout=timeout_s, trust_env=False) as http, \
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        result.status, result.headers = response.status_code, dict(response.headers)
        if response.status_code != 200:
            result.error = json.loads(response.read())["error"]
            return result
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                result.done = True
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                result.error = event["error"]
            for choice in event.get("choices", []):
                result.text += choice["delta"].get("content", "") or ""
    return result


DRAGONS = chat_body("Write a short poem about dragons.", max_tokens=32)  # the repro prompt
LONG = chat_body("Tell me a long story about a dragon.", max_tokens=400, ignore_eos=True)


def answer(stack: FaultStack, body: dict) -> tuple[str, int]:
    """(text, cached prompt tokens) of a greedy non-streaming answer."""
    response = stack.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    return reply["choices"][0]["message"]["content"], reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def start_streams(stack: FaultStack, count: int, body: dict = LONG
                  ) -> tuple[list[threading.Thread], list[StreamResult]]:
    """`count` streams in threads, returned once every one has streamed some text (its status line is out)."""
    results = [StreamResult() for _ in range(count)]
    threads = [threading.Thread(target=stream_chat, args=(stack.http.base_url, body, 120, result), daemon=True)
               for result in results]
    for thread in threads:
        thread.start()
    wait_for(lambda: all(r.text for r in results), 60, what=f"{count} streams streaming")
    return threads, results


def join(threads: list[threading.Thread], timeout_s: float) -> None:
    for thread in threads:
        thread.join(timeout_s)
    assert not any(t.is_alive() for t in threads), f"a stream still runs after {timeout_s}s"
