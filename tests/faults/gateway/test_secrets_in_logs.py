"""Finding 7 on real processes: no secret and no prompt reaches any service's log. The stack runs with an API key,
an internal token and a Redis URL whose password Redis refuses; the Redis lines show the URL masked."""

from __future__ import annotations

import httpx

from tests.faults.gateway.stack import API_KEY, AUTH, INTERNAL_TOKEN, REDIS_PASSWORD
from tests.integration.processes import wait_for

CANARY = "canary-7b1e9d-prompt-text"


def test_no_secret_or_prompt_in_any_log(quiescent):
    stack = quiescent
    with httpx.Client(base_url=stack.base_url, headers=AUTH, timeout=300) as http:
        chat = {"messages": [{"role": "user", "content": f"Repeat: {CANARY}"}], "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        assert http.post("/v1/chat/completions", json={**chat, "stream": True}).status_code == 200
        assert http.post("/v1/completions", json={"prompt": CANARY, "max_tokens": 2}).status_code == 200
        assert http.post("/v1/completions", json={"prompt": CANARY, "max_tokens": 0}).status_code == 400
        assert http.post("/tokenize", json={"prompt": CANARY}).status_code == 200
        assert http.get("/v1/models", headers={"Authorization": f"Bearer wrong-{API_KEY}"}).status_code == 401
    wait_for(lambda: "unavailable" in stack.serve.log(), 30, what="the Redis auth-failure warning")
    logs = {path.name: path.read_text(errors="replace") for path in stack.tmp_dir.glob("*.log")}
    for name, text in logs.items():
        for secret in (API_KEY, INTERNAL_TOKEN, REDIS_PASSWORD, CANARY):
            assert secret not in text, f"{secret!r} in {name}"
    serve_log = logs["serve.log"]
    assert "Redis state copy at redis://:***@127.0.0.1:" in serve_log
    assert "Redis at redis://:***@127.0.0.1:" in serve_log and "unavailable" in serve_log
