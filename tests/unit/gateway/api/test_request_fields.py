"""Request fields beyond the basics against a fake scheduler: null as default, developer as system, refused content
parts, legacy functions, echo with max_tokens 0, answer-changing fields refused by name, no-op fields accepted."""

from __future__ import annotations

import json

import pytest

from tests.unit.gateway.structured.test_tool_calls_api import ASK, gateway
from tests.unit.gateway.structured.test_tools import WEATHER
from tests.unit.gateway.test_app import sse_chunks

CHAT = {"model": "tiny-model", "messages": [{"role": "user", "content": "Hi"}]}
REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_explicit_null_means_the_default(tokenizer):
    nulls = {"n": None, "stream": None, "logprobs": None, "parallel_tool_calls": None, "max_tokens": None,
             "top_logprobs": None, "stop": None, "stream_options": None, "tool_choice": None, "user": None}
    with gateway(tokenizer, "Paris.") as (client, fake, _):
        chat = client.post("/v1/chat/completions", json={**CHAT, **nulls})
        completion = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "Hi", "echo": None,
                                                          "logprobs": None, "n": None, "stream": None})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == "Paris."
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"] == "Paris."


def test_developer_role_is_system(tokenizer):
    with gateway(tokenizer, "ok") as (client, fake, _):
        dev = client.post("/tokenize", json={"messages": [{"role": "developer", "content": "Be brief."},
                                                          {"role": "user", "content": "Hi"}]}).json()
        system = client.post("/tokenize", json={"messages": [{"role": "system", "content": "Be brief."},
                                                             {"role": "user", "content": "Hi"}]}).json()
    assert dev["tokens"] == system["tokens"]


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                                  {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])
def test_non_text_content_parts_are_refused_by_name(tokenizer, part):
    body = {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]}
    with gateway(tokenizer, "ok") as (client, _, _):
        answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert part["type"] in error["message"] and error["param"] == "messages.0.content", error


def test_legacy_functions_are_tools(tokenizer):
    body = {**CHAT, "functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}}
    with gateway(tokenizer, REPLY) as (client, fake, checker):
        answer = client.post("/v1/chat/completions", json=body)
        both = client.post("/v1/chat/completions", json={**body, "tools": [WEATHER]})
    assert answer.status_code == 200, answer.text
    call = answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert checker.checked[0].param == "tools"  # the named call's grammar was asked for
    assert both.status_code == 400 and both.json()["error"]["param"] == "functions"


def test_echo_with_max_tokens_zero_returns_the_prompt_without_generating(tokenizer):
    with gateway(tokenizer, "never") as (client, fake, _):
        whole = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "One two", "echo": True,
                                                     "max_tokens": 0})
        streamed = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "One two", "echo": True,
                                                        "max_tokens": 0, "stream": True})
        without_echo = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "x", "max_tokens": 0})
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("One two", "length")
    assert whole.json()["usage"]["completion_tokens"] == 0 and whole.json()["usage"]["prompt_tokens"] >= 2
    assert "".join(c["choices"][0]["text"] for c in sse_chunks(streamed) if c["choices"]) == "One two"
    assert not fake.requests
    assert without_echo.status_code == 400 and without_echo.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(("field", "value"), [
    ("best_of", 3), ("prediction", {"type": "content", "content": "x"}),
    ("skip_special_tokens", False), ("use_beam_search", True), ("echo", True), ("reasoning_effort", "low"),
    ("allowed_token_ids", [1, 2])])
def test_fields_that_would_change_the_answer_are_refused_by_name(tokenizer, field, value):
    with gateway(tokenizer, "ok") as (client, fake, _):
        answer = client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == field and field in answer.json()["error"]["message"]
    assert not fake.requests


def test_no_op_values_and_no_op_fields_are_accepted(tokenizer):
    fields = {"best_of": 1, "skip_special_tokens": True, "user": "u", "store": False,
              "metadata": {"a": "b"}, "service_tier": "auto", "priority": 3, "some_future_field": 1}
    with gateway(tokenizer, "ok") as (client, _, _):
        answer = client.post("/v1/chat/completions", json={**CHAT, **fields})
    assert answer.status_code == 200, answer.text


def test_include_stop_str_and_truncate_prompt_tokens(tokenizer):
    with gateway(tokenizer, "One. Two. Three.") as (client, fake, _):
        kept = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "a b c d e f", "stop": ["Two"],
                                                    "include_stop_str_in_output": True, "truncate_prompt_tokens": 2})
        cut = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "a b c d", "stop": ["Two"]})
    assert kept.json()["choices"][0]["text"] == "One. Two"
    assert cut.json()["choices"][0]["text"] == "One. "
    assert len(fake.requests[0].prompt_token_ids) == 2


def test_a_call_cut_by_max_tokens_is_never_half_parsed(tokenizer):
    """Issue 40: every cut of a required call, whole and streamed: arguments that parse or no call, no markup in
    content, finish_reason length."""
    num_tokens = len(tokenizer.encode(REPLY, add_special_tokens=False))
    with gateway(tokenizer, REPLY) as (client, _, _):
        for max_tokens in range(1, num_tokens + 2):  # the last one reaches EOS
            body = {**ASK, "tool_choice": "required", "max_tokens": max_tokens}
            message = client.post("/v1/chat/completions", json=body).json()["choices"][0]
            chunks = sse_chunks(client.post("/v1/chat/completions", json={**body, "stream": True}))
            assert "<tool_call" not in (message["message"]["content"] or "") and "{" not in (
                message["message"]["content"] or "")
            for call in message["message"].get("tool_calls") or []:
                assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
            streamed_args = "".join(tc["function"].get("arguments", "") for c in chunks for ch in c["choices"]
                                    for tc in ch["delta"].get("tool_calls") or [])
            assert streamed_args in ("", '{"city": "Paris"}')
            assert not any(ch["delta"].get("content") for c in chunks for ch in c["choices"])
            expected = "length" if max_tokens <= num_tokens else "tool_calls"
            assert message["finish_reason"] == expected


def test_the_context_length_is_checked_before_the_grammar_compiles(tokenizer):
    body = {**CHAT, "max_tokens": 10**6, "response_format": {"type": "json_object"}}
    with gateway(tokenizer, "{}") as (client, fake, checker):
        answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
    assert checker.checked == [] and not fake.requests
