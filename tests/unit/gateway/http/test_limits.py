"""Body-size limit (413 while the body arrives) and prompt work kept off the event loop."""

from __future__ import annotations

import re
import threading

import pytest

from tests.unit.gateway.fake_scheduler import DESCRIPTION
from tests.unit.gateway.test_app import CHAT, gateway_with_state

LIMIT = 4096


def _assert_413(response) -> None:
    assert response.status_code == 413, response.text
    assert response.json()["error"] == {
        "message": f"The request body is larger than this server's limit of {LIMIT} bytes.",
        "type": "invalid_request_error", "param": None, "code": "request_too_large"}


def test_a_body_over_the_limit_is_413_whether_declared_or_chunked(tokenizer):
    body = b'{"prompt": "' + b"a" * LIMIT + b'", "max_tokens": 1}'
    with gateway_with_state(tokenizer, max_body_bytes=LIMIT) as (client, fake, _):
        declared = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        chunked = client.post("/v1/completions", content=iter([body[:100], body[100:]]),
                              headers={"content-type": "application/json"})
        within = client.post("/v1/completions", json={"prompt": "a" * 100, "max_tokens": 1})
    assert "content-length" not in chunked.request.headers  # sent chunked: only counting can catch it
    _assert_413(declared)
    _assert_413(chunked)
    assert within.status_code == 200 and len(fake.requests) == 1


def test_a_declared_oversize_body_is_refused_before_it_is_read(tokenizer):
    """The 413 for a Content-Length over the limit never calls receive: nothing of the body is read."""
    with gateway_with_state(tokenizer, max_body_bytes=LIMIT) as (client, _, _):
        def never_sent():
            raise AssertionError("the body was read")
            yield b""

        response = client.post("/tokenize", content=never_sent(),
                               headers={"content-length": str(LIMIT + 1), "content-type": "application/json"})
    _assert_413(response)


def test_health_answers_while_a_prompt_is_tokenized(tokenizer, monkeypatch):
    """Tokenizing runs on the tokenizer's threads: /health is answered while it is still going on."""
    health_answered, tokenizing = threading.Event(), threading.Event()
    real_encode = tokenizer.encode

    def slow_encode(*args, **kwargs):
        tokenizing.set()
        assert health_answered.wait(30), "/health was not answered while tokenizing (on the event loop?)"
        return real_encode(*args, **kwargs)

    with gateway_with_state(tokenizer) as (client, _, _):
        monkeypatch.setattr(tokenizer, "encode", slow_encode)
        results = {}
        worker = threading.Thread(target=lambda: results.setdefault(
            "chat", client.post("/v1/chat/completions", json=CHAT)))
        worker.start()
        assert tokenizing.wait(30)
        results["health"] = client.get("/health")
        health_answered.set()
        worker.join(60)
    assert results["health"].status_code == 200 and results["chat"].status_code == 200


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x" * 30_000, "max_tokens": 1}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 30_000}]}, "messages"),
    ("/tokenize", {"prompt": "x" * 30_000}, "prompt"),
])
def test_a_text_too_long_for_the_context_is_refused_without_tokenizing_it(tokenizer, monkeypatch, path, body,
                                                                           param):
    """No token stands for more than max_token_chars characters, so a text of 30,000 characters holds more than the
    fake model's 256-token context: refused at once."""
    assert 30_000 // tokenizer.max_token_chars >= DESCRIPTION.max_model_len
    with gateway_with_state(tokenizer) as (client, _, _):
        monkeypatch.setattr(tokenizer.tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized"))
        response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "context_length_exceeded")
    at_least = int(re.search(r"has at least (\d+) input tokens", error["message"]).group(1))
    assert at_least >= -(-30_000 // tokenizer.max_token_chars)  # the chat template adds its own text


def test_the_token_bound_holds_on_real_text(tokenizer):
    """The bound is a true lower bound: never more than the real count (the default model is byte-level BPE)."""
    assert tokenizer.max_token_chars == 81
    for text in ("=" * 5000, " " * 3000 + "\n" * 100, "héllo wörld " * 300, "\U0001f600" * 500, "a"):
        assert tokenizer.num_tokens_at_least(text) <= len(tokenizer.encode(text, add_special_tokens=False))
