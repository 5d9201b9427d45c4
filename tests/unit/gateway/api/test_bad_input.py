"""Inputs that once got a 500 (and a dropped connection): each is a 400 naming its field, streamed or not."""

from __future__ import annotations

import json

import grpc
import grpc.aio
import pytest

from pagedserve.services.gateway.api.protocol import lone_surrogate_path
from tests.unit.gateway.test_app import CHAT, gateway

MESSAGES = CHAT["messages"]
SURROGATE = "\ud800"  # what JSON's "\ud800" escape decodes to
CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


def post(client, path: str, body: dict):
    """As a client sends it: JSON with \\u escapes for surrogates and Infinity for 1e400."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def chat(**fields) -> tuple[str, dict]:
    return CHAT_PATH, {"messages": MESSAGES, "max_tokens": 2, **fields}


def completion(**fields) -> tuple[str, dict]:
    return COMPLETIONS_PATH, {"prompt": "Paris is", "max_tokens": 2, **fields}


# case -> ((path, body), the error's param)
CASES = {
    "seed 2**63": (chat(seed=2**63), "seed"),
    "seed 2**64": (chat(seed=2**64), "seed"),
    "seed -2**63 - 1": (completion(seed=-2**63 - 1), "seed"),
    "top_k 3e9": (chat(top_k=3_000_000_000), "top_k"),
    "prompt token 2**40": (completion(prompt=[1, 2**40]), "prompt"),
    "prompt token -1": (completion(prompt=[[5, 6], [-1]]), "prompt"),
    "prompt token past the vocabulary": (completion(prompt=[49152]), "prompt"),
    "lone surrogate in chat": (chat(messages=[{"role": "user", "content": f"hi {SURROGATE}"}]),
                               "messages.0.content"),
    "lone surrogate in a content part": (chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": SURROGATE}]}]), "messages.0.content.0.text"),
    "lone surrogate in a completion": (completion(prompt=f"a{SURROGATE}"), "prompt"),
    "lone surrogate in one of the prompts": (completion(prompt=["ok", SURROGATE]), "prompt.1"),
    "lone surrogate in a stop string": (completion(stop=["x", SURROGATE]), "stop.1"),
    "lone surrogate in cache_salt": (completion(cache_salt=SURROGATE), "cache_salt"),
    "lone surrogate in model": (completion(model=SURROGATE), "model"),
    "lone surrogate in a logit_bias key": (completion(logit_bias={SURROGATE: 1}), "logit_bias.\\ud800"),
    "max_tokens 2**40": (chat(max_tokens=2**40), "max_tokens"),
    "max_completion_tokens 2**64": (chat(max_completion_tokens=2**64), "max_completion_tokens"),
    "min_tokens 2**40": (chat(min_tokens=2**40), "min_tokens"),
    "logprobs 2**40": (completion(logprobs=2**40), "logprobs"),
    "top_logprobs 2**40": (chat(logprobs=True, top_logprobs=2**40), "top_logprobs"),
    "n 2**40": (chat(n=2**40), "n"),
    "prompts x n over the cap": (completion(prompt=["a"] * 5, n=4), "prompt"),
    "logit_bias id 2**40": (chat(logit_bias={str(2**40): 1}), "logit_bias"),
    "logit_bias value 1e400": (chat(logit_bias={"5": 1e400}), "logit_bias.5"),
    "stop_token_ids 2**40": (chat(stop_token_ids=[2**40]), "stop_token_ids"),
    "temperature 1e400": (chat(temperature=1e400), "temperature"),
    "repetition_penalty 1e400": (chat(repetition_penalty=1e400), "repetition_penalty"),
    "17 stop strings": (completion(stop=[str(i) for i in range(17)]), "stop"),
    "a stop string of 257 characters": (completion(stop="x" * 257), "stop"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_a_400_naming_its_field(tokenizer, case, stream):
    (path, body), param = CASES[case]
    with gateway(tokenizer) as (client, fake):
        response = post(client, path, {**body, "stream": stream})
        assert response.status_code == 400, response.text
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["param"]) == ("invalid_request_error", param), error
        assert fake.requests == []  # refused before reaching the scheduler
        assert post(client, path, {**(chat() if path == CHAT_PATH else completion())[1], "stream": stream}
                    ).status_code == 200


def test_tokenize_and_detokenize_refuse_bad_text_and_ids(tokenizer):
    with gateway(tokenizer) as (client, _):
        text = post(client, "/tokenize", {"prompt": f"a{SURROGATE}b"})
        chat_text = post(client, "/tokenize", {"messages": [{"role": "user", "content": SURROGATE}]})
        ids = client.post("/detokenize", json={"tokens": [2**70]})
    assert (text.status_code, text.json()["error"]["param"]) == (400, "prompt")
    assert (chat_text.status_code, chat_text.json()["error"]["param"]) == (400, "messages.0.content")
    assert (ids.status_code, ids.json()["error"]["param"]) == (400, "tokens")


def test_the_largest_seed_still_gives_n_distinct_seeds(tokenizer):
    """Choice i samples with seed + i: past 2**63 - 1 it wraps to stay a 64-bit seed."""
    with gateway(tokenizer) as (client, fake):
        response = client.post(COMPLETIONS_PATH, json={"prompt": "a", "max_tokens": 1, "n": 3, "seed": 2**63 - 1})
    assert response.status_code == 200, response.text
    assert [r.sampling.seed for r in fake.requests] == [2**63 - 1, -2**63, -2**63 + 1]


def test_duplicate_stop_token_ids_are_sent_once(tokenizer):
    with gateway(tokenizer) as (client, fake):
        client.post(CHAT_PATH, json={**CHAT, "max_tokens": 1, "stop_token_ids": [7, 7, 9, 7] * 1000})
    assert fake.requests[0].sampling.stop_token_ids == (7, 9)


def test_lone_surrogate_path_names_the_first_bad_string():
    assert lone_surrogate_path({"a": ["ok", {"b": [1, 2, "x\udfff"]}]}) == "a.1.b.2"
    assert lone_surrogate_path({"a": "fine", "n": 3, "p": [1, 2, 3]}) is None
    assert lone_surrogate_path({"k\ud800": 1}) == "k\\ud800"
    assert lone_surrogate_path("\U0001f600 paired surrogates are fine") is None


def test_an_unexpected_error_is_a_json_500_not_a_dropped_connection(tokenizer):
    """The last-resort handler must answer and return: the connection stays usable for the next request."""
    with gateway(tokenizer) as (client, fake):
        fake.fail_after = (0, ZeroDivisionError("boom"))
        failed = client.post(CHAT_PATH, json=CHAT)  # TestClient re-raises what escapes the app: it must not
        fake.fail_after = None
        after = client.post(CHAT_PATH, json=CHAT)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert "boom" not in failed.text and after.status_code == 200


def _overloaded(retry_after_s: str) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("retry-after-s", retry_after_s))
    return grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), trailing,
                                "the queue is full: predicted wait 40 s")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_overloaded_scheduler_is_a_429_with_its_retry_after(tokenizer, stream):
    with gateway(tokenizer) as (client, fake):
        fake.fail_after = (0, _overloaded("7"))
        response = client.post(CHAT_PATH, json={**CHAT, "stream": stream})
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert error["message"] == "the queue is full: predicted wait 40 s"


def test_every_503_carries_retry_after(tokenizer):
    with gateway(tokenizer, serving=False, wait_ready=False) as (client, _):
        health = client.get("/health")
        refused = client.post(CHAT_PATH, json=CHAT)
    assert health.status_code == refused.status_code == 503
    assert health.headers["retry-after"] == refused.headers["retry-after"] == "1"
