"""Bad inputs get the right status and OpenAI-shaped JSON, and the server keeps serving after each."""

from __future__ import annotations

import pytest

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
LONG_PROMPT = "hello " * 9000  # more tokens than the model's 8192-token context


def chat(**fields) -> tuple[str, dict]:
    return "/v1/chat/completions", {"messages": FRANCE, "max_tokens": 4, **fields}


CASES = {
    "prompt over the context": (("/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4}), 400, "prompt"),
    "max_tokens < 1": (chat(max_tokens=0), 400, "max_tokens"),
    "temperature < 0": (chat(temperature=-0.5), 400, "temperature"),
    "top_p > 1": (chat(top_p=1.2), 400, "top_p"),
    "n = 0": (chat(n=0), 400, "n"),
    "unknown model": (chat(model="no-such-model"), 404, "model"),
    "wrong type": (chat(max_tokens="lots"), 400, "max_tokens"),
    "empty messages": (chat(messages=[]), 400, "messages"),
    "max_tokens over the context": (chat(max_tokens=9000), 400, "max_tokens"),
}


def assert_openai_error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def assert_still_serving(http) -> None:
    response = http.post("/v1/chat/completions", json={"messages": FRANCE, "max_tokens": 1})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("case", CASES)
def test_bad_request(http, case):
    (path, body), status, param = CASES[case]
    error = assert_openai_error(http.post(path, json=body), status)
    assert error["param"] == param
    if case == "prompt over the context":
        num_tokens = http.post("/tokenize", json={"prompt": LONG_PROMPT}).json()["count"]
        assert "maximum context length is 8192 tokens" in error["message"]
        assert f"{num_tokens} input tokens" in error["message"]
    assert_still_serving(http)


def test_malformed_json(http):
    response = http.post("/v1/chat/completions", content=b'{"messages": [{"role": "user"',
                         headers={"content-type": "application/json"})
    assert assert_openai_error(response, 400)["code"] == "invalid_json"
    assert_still_serving(http)


def test_unknown_route_is_openai_shaped_404(http):
    assert_openai_error(http.get("/v1/nothing-here"), 404)
    assert_still_serving(http)
