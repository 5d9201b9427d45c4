"""Chat answers with tool calls against a fake scheduler: OpenAI's message and stream shapes, finish reasons."""

from __future__ import annotations

import json
from contextlib import contextmanager

from pagedserve.shared.structured_output import StructuredOutputKind
from tests.unit.gateway.app_client import checked_gateway
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient
from tests.unit.gateway.structured.test_tools import TIME, WEATHER
from tests.unit.gateway.test_app import sse_chunks

CALLS_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
ASK = {"model": "tiny-model", "messages": [{"role": "user", "content": "Weather and time in Paris?"}],
       "tools": [WEATHER, TIME]}


@contextmanager
def gateway(tokenizer, reply: str):
    fake = FakeSchedulerClient(tokenizer, reply=reply)
    with checked_gateway(tokenizer, fake) as (client, _, checker):
        yield client, fake, checker


def streamed_calls(chunks: list[dict]) -> tuple[str, list[dict], str]:
    """Content, calls and finish reason reassembled from stream chunks the way OpenAI's SDK does."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                entry = calls.setdefault(call["index"], {"id": call.get("id"), "type": call.get("type"),
                                                         "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += call.get("function", {}).get("name") or ""
                entry["function"]["arguments"] += call["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_required_calls_whole_and_streamed(tokenizer):
    with gateway(tokenizer, CALLS_TEXT) as (client, fake, checker):
        whole = client.post("/v1/chat/completions", json={**ASK, "tool_choice": "required"}).json()
        stream = sse_chunks(client.post("/v1/chat/completions", json={**ASK, "tool_choice": "required",
                                                                       "stream": True}))
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(c["id"].startswith("call_") for c in calls)
    assert stream[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    first_call = next(c for c in stream if c["choices"] and "tool_calls" in c["choices"][0]["delta"])
    assert first_call["choices"][0]["delta"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    content, reassembled, finish = streamed_calls(stream)
    assert content == "" and finish == "tool_calls"
    assert [c["function"] for c in reassembled] == [c["function"] for c in calls]
    assert all(chunk["choices"][0]["delta"].keys() <= {"tool_calls"} for chunk in stream[1:-1])
    assert checker.checked[0].param == "tools" and checker.checked[0].structured.kind is \
        StructuredOutputKind.STRUCTURAL_TAG
    assert fake.requests[0].sampling.structured_output == checker.checked[0].structured


def test_a_named_choice_finishes_with_stop_and_auto_text_stays_content(tokenizer):
    named = {**ASK, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    with gateway(tokenizer, CALLS_TEXT.split("\n<tool_call>\n{\"name\": \"get_time")[0]) as (client, _, _):
        assert client.post("/v1/chat/completions", json=named).json()["choices"][0]["finish_reason"] == "stop"
    with gateway(tokenizer, "It is sunny in Paris.") as (client, _, _):
        whole = client.post("/v1/chat/completions", json=ASK).json()
        stream = sse_chunks(client.post("/v1/chat/completions", json={**ASK, "stream": True}))
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny in Paris."}
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert streamed_calls(stream) == ("It is sunny in Paris.", [], "stop")


def test_tool_choice_none_returns_the_text_as_it_is(tokenizer):
    with gateway(tokenizer, CALLS_TEXT) as (client, fake, checker):
        whole = client.post("/v1/chat/completions", json={**ASK, "tool_choice": "none"}).json()
    assert whole["choices"][0]["message"]["content"] == CALLS_TEXT and whole["choices"][0]["finish_reason"] == "stop"
    assert checker.checked == [] and fake.requests[0].sampling.structured_output is None


def test_response_format_and_tools_conflict_unless_tool_choice_is_none(tokenizer):
    with gateway(tokenizer, "{}") as (client, _, _):
        response = client.post("/v1/chat/completions", json={**ASK, "response_format": {"type": "json_object"}})
        allowed = client.post("/v1/chat/completions", json={**ASK, "tool_choice": "none",
                                                             "response_format": {"type": "json_object"}})
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"
    assert allowed.status_code == 200
