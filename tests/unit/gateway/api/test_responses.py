"""POST /v1/responses against a fake scheduler: text, instructions, json_schema, function tools and their outputs,
stored turns (in a real redis-server and in memory), refusals, and the stream, each object checked against the
`openai` SDK's own types (and the SDK's stream accumulator, over the test client)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from pagedserve.services.ports import free_port
from pagedserve.shared.structured_output import StructuredOutputKind
from tests.integration.processes import RedisServer
from tests.unit.gateway.app_client import checked_gateway
from tests.unit.gateway.fake_scheduler import DESCRIPTION, FakeSchedulerClient
from tests.unit.gateway.structured.test_tool_calls_api import CALLS_TEXT

REPLY = "The capital of France is Paris."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time"}
EVENTS = TypeAdapter(ResponseStreamEvent)


@contextmanager
def gateway(tokenizer, reply: str = REPLY, max_model_len: int = 1024, **config):
    fake = FakeSchedulerClient(tokenizer, reply=reply, description=replace(DESCRIPTION, max_model_len=max_model_len))
    with checked_gateway(tokenizer, fake, **config) as (client, state, _):
        yield client, fake, state


def prompt_of(tokenizer, fake: FakeSchedulerClient, i: int = -1) -> str:
    return tokenizer.decode(fake.requests[i].prompt_token_ids, False)


def stream_events(response) -> list[dict]:
    """The events of a Responses stream, each checked against the SDK's event types and its `event:` line."""
    assert response.status_code == 200, response.text
    frames = [frame for frame in response.text.split("\n\n") if frame]
    events = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        event = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        EVENTS.validate_python(event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def test_text_with_instructions(tokenizer):
    with gateway(tokenizer) as (client, fake, _):
        answer = client.post("/v1/responses", json={"model": "tiny-model", "input": "Capital of France?",
                                                    "instructions": "Answer in one sentence.",
                                                    "store": False})
    assert answer.status_code == 200, answer.text
    response = Response.model_validate(answer.json())
    assert response.id.startswith("resp_") and response.object == "response" and response.status == "completed"
    assert response.output_text == REPLY and response.instructions == "Answer in one sentence."
    [message] = response.output
    assert message.type == "message" and message.role == "assistant" and message.content[0].type == "output_text"
    prompt = prompt_of(tokenizer, fake)
    assert prompt.index("Answer in one sentence.") < prompt.index("Capital of France?")
    assert response.usage.input_tokens == len(fake.requests[0].prompt_token_ids)
    assert response.usage.output_tokens == len(tokenizer.encode(REPLY, add_special_tokens=False)) + 1  # with EOS
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_input_messages_and_sampling_fields(tokenizer):
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
             {"role": "user", "content": "Capital of France?"}]
    with gateway(tokenizer) as (client, fake, _):
        answer = client.post("/v1/responses", json={"input": items, "temperature": 0.5, "top_p": 0.9,
                                                    "max_output_tokens": 40, "store": False})
    assert answer.status_code == 200, answer.text
    prompt = prompt_of(tokenizer, fake)
    assert prompt.index("Hi") < prompt.index("Hello!") < prompt.index("Capital of France?")
    sampling = fake.requests[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.max_tokens) == (0.5, pytest.approx(0.9), 40)
    assert answer.json()["temperature"] == 0.5 and answer.json()["max_output_tokens"] == 40


def test_cut_by_max_output_tokens_is_incomplete(tokenizer):
    with gateway(tokenizer) as (client, _, _):
        answer = client.post("/v1/responses", json={"input": "Capital?", "max_output_tokens": 3, "store": False})
        events = stream_events(client.post("/v1/responses", json={"input": "Capital?", "max_output_tokens": 3,
                                                                  "stream": True, "store": False}))
    response = Response.model_validate(answer.json())
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete" and response.usage.output_tokens == 3
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["status"] == "incomplete" and events[-1]["response"]["incomplete_details"] == {
        "reason": "max_output_tokens"}
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == response.output_text


def test_json_schema_format(tokenizer):
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"]}
    with gateway(tokenizer, reply='{"capital": "Paris"}') as (client, _, state):
        answer = client.post("/v1/responses", json={"input": "Capital of France as JSON", "store": False, "text": {
            "format": {"type": "json_schema", "name": "capital", "schema": schema, "strict": True}}})
    assert answer.status_code == 200, answer.text
    response = Response.model_validate(answer.json())
    assert json.loads(response.output_text) == {"capital": "Paris"}
    [checked] = state.grammar_checker.checked
    assert checked.structured.kind == StructuredOutputKind.JSON_SCHEMA and json.loads(checked.structured.spec) == schema
    assert response.text.format.type == "json_schema"


def test_json_object_format_and_a_bad_schema(tokenizer):
    with gateway(tokenizer, reply='{"a": 1}') as (client, _, state):
        ok = client.post("/v1/responses", json={"input": "JSON", "store": False,
                                                "text": {"format": {"type": "json_object"}}})
        bad = client.post("/v1/responses", json={"input": "JSON", "store": False,
                                                 "text": {"format": {"type": "json_schema", "name": "x"}}})
    assert ok.status_code == 200
    assert state.grammar_checker.checked[0].structured.kind == StructuredOutputKind.JSON_OBJECT
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text.format.schema"


def test_function_calls_then_their_outputs(tokenizer):
    with gateway(tokenizer, reply=CALLS_TEXT) as (client, fake, _):
        first = client.post("/v1/responses", json={"input": "Weather and time in Paris?", "tools": [WEATHER, TIME],
                                                   "tool_choice": "required", "store": False})
        response = Response.model_validate(first.json())
        calls = [item for item in response.output if item.type == "function_call"]
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                      ("get_time", {})]
        assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
        assert response.status == "completed" and not [i for i in response.output if i.type == "message"]
        follow_up = [{"role": "user", "content": "Weather and time in Paris?"},
                     *[c.model_dump(exclude_none=True) for c in calls],
                     {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"},
                     {"type": "function_call_output", "call_id": calls[1].call_id, "output": "12:30"}]
        fake.reply_ids = tokenizer.encode("Sunny and 21 C at 12:30.", add_special_tokens=False) + [2]
        second = client.post("/v1/responses", json={"input": follow_up, "tools": [WEATHER, TIME], "store": False})
    assert second.status_code == 200, second.text
    assert Response.model_validate(second.json()).output_text == "Sunny and 21 C at 12:30."
    prompt = prompt_of(tokenizer, fake)
    assert prompt.index('"get_weather"') < prompt.index("sunny, 21 C") < prompt.index("12:30")
    assert '{"city": "Paris"}' in prompt  # the earlier call, rendered as the model wrote it


def test_named_tool_choice_and_a_bad_call_argument(tokenizer):
    with gateway(tokenizer, reply=CALLS_TEXT.split("\n<tool_call>\n{\"name\": \"get_time\"")[0]) as (client, _, _):
        named = client.post("/v1/responses", json={"input": "Weather?", "tools": [WEATHER, TIME], "store": False,
                                                   "tool_choice": {"type": "function", "name": "get_weather"}})
        bad = client.post("/v1/responses", json={"store": False, "input": [
            {"role": "user", "content": "x"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{not json"}]})
    assert named.status_code == 200, named.text
    assert named.json()["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert [item["name"] for item in named.json()["output"]] == ["get_weather"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1].arguments"


def test_a_chat_error_names_the_responses_field(tokenizer):
    strict = {**WEATHER, "strict": True, "parameters": {"type": "object", "not": {"required": ["city"]}}}
    with gateway(tokenizer) as (client, _, _):
        answer = client.post("/v1/responses", json={"input": "Weather?", "tools": [strict], "store": False})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "tools[0].parameters"
    assert "'not'" in answer.json()["error"]["message"]


@pytest.mark.parametrize("tool", ["web_search", "web_search_preview", "file_search", "code_interpreter", "mcp"])
def test_built_in_tools_are_refused_by_name(tokenizer, tool):
    with gateway(tokenizer) as (client, fake, _):
        answer = client.post("/v1/responses", json={"input": "Search", "tools": [WEATHER, {"type": tool}]})
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    assert repr(tool) in answer.json()["error"]["message"] and answer.json()["error"]["param"] == "tools[1].type"
    assert not fake.requests


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": "msg_1"}]}, "input[1]"),
    ({"input": [{"type": "function_call_output", "output": "m"}]}, "input[0].call_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_what_is_not_served_is_a_400(tokenizer, body, param):
    with gateway(tokenizer) as (client, fake, _):
        answer = client.post("/v1/responses", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert not fake.requests


def test_refused_parts_and_items_are_named(tokenizer):
    with gateway(tokenizer) as (client, _, _):
        image = client.post("/v1/responses", json={"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]}).json()["error"]["message"]
        reference = client.post("/v1/responses", json={"input": [{"type": "item_reference", "id": "m"}]}).json()
    assert "input_image" in image
    assert "item_reference" in reference["error"]["message"]


def test_stream_events_follow_the_sdk_contract(tokenizer):
    with gateway(tokenizer) as (client, _, _):
        whole = client.post("/v1/responses", json={"input": "Capital?", "store": False}).json()
        events = stream_events(client.post("/v1/responses", json={"input": "Capital?", "stream": True,
                                                                  "store": False}))
    types = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"} and len(deltas) > 3
    final = events[-1]["response"]
    assert "".join(d["delta"] for d in deltas) == REPLY == final["output"][0]["content"][0]["text"]
    assert events[-4]["text"] == REPLY and events[-2]["item"] == final["output"][0]
    assert final["status"] == "completed" and final["usage"] == whole["usage"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert {d["item_id"] for d in deltas} == {final["output"][0]["id"]}


def test_streamed_function_calls(tokenizer):
    with gateway(tokenizer, reply=CALLS_TEXT) as (client, _, _):
        events = stream_events(client.post("/v1/responses", json={
            "input": "Weather and time?", "tools": [WEATHER, TIME], "stream": True, "store": False}))
    final = events[-1]["response"]
    assert final["status"] == "completed" and [i["type"] for i in final["output"]] == ["function_call"] * 2
    for index, item in enumerate(final["output"]):
        pieces = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"
                  and e["output_index"] == index]
        [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"
                  and e["output_index"] == index]
        assert "".join(pieces) == done["arguments"] == item["arguments"]
    assert json.loads(final["output"][0]["arguments"]) == {"city": "Paris"}


def test_the_sdk_accumulates_the_stream_to_the_final_response(tokenizer):
    with gateway(tokenizer) as (client, _, _):
        sdk = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
        created = sdk.responses.create(model="tiny-model", input="Capital of France?", store=False)
        with sdk.responses.stream(model="tiny-model", input="Capital of France?", store=False) as stream:
            deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert created.output_text == REPLY == final.output_text == "".join(deltas)


def _conversation_turns(client, tokenizer, fake, other_client=None):
    first = client.post("/v1/responses", json={"input": "My name is Ada.", "instructions": "Be brief."}).json()
    fake.reply_ids = tokenizer.encode("Your name is Ada.", add_special_tokens=False) + [2]
    second = client.post("/v1/responses", json={"input": "What is my name?", "previous_response_id": first["id"]})
    assert second.status_code == 200, second.text
    prompt = prompt_of(tokenizer, fake)
    assert prompt.index("My name is Ada.") < prompt.index(REPLY) < prompt.index("What is my name?")
    assert "Be brief." not in prompt  # instructions are not carried over (as OpenAI)
    second = second.json()
    assert second["previous_response_id"] == first["id"]
    reader = other_client or client
    assert reader.get(f"/v1/responses/{second['id']}").json() == second
    deleted = reader.delete(f"/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response", "deleted": True}
    gone = reader.get(f"/v1/responses/{first['id']}")
    assert gone.status_code == 404 and gone.json()["error"]["type"] == "invalid_request_error"
    unknown = client.post("/v1/responses", json={"input": "x", "previous_response_id": first["id"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "previous_response_id"
    third = client.post("/v1/responses", json={"input": "And again?", "previous_response_id": second["id"]})
    prompt = prompt_of(tokenizer, fake)
    assert third.status_code == 200 and prompt.index("My name is Ada.") < prompt.index("Your name is Ada.")


def test_previous_response_id_through_redis_from_another_gateway(tokenizer, tmp_path):
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    try:
        with gateway(tokenizer, redis_url=server.url) as (client, fake, _), \
                gateway(tokenizer, redis_url=server.url) as (other, _, _):
            _conversation_turns(client, tokenizer, fake, other_client=other)
            keys = server.client().keys("pagedserve:response:*")
            ttls = [server.client().ttl(key) for key in keys]
            streamed = stream_events(client.post("/v1/responses", json={"input": "Hi", "stream": True}))
            stored = other.get(f"/v1/responses/{streamed[-1]['response']['id']}")
        assert keys and all(0 < ttl <= 3600 for ttl in ttls)
        assert stored.status_code == 200 and stored.json() == streamed[-1]["response"]
    finally:
        server.kill()


def test_previous_response_id_in_memory_without_redis(tokenizer):
    with gateway(tokenizer) as (client, fake, state):
        _conversation_turns(client, tokenizer, fake)
        metrics = client.get("/metrics").text
        unstored = client.post("/v1/responses", json={"input": "x", "store": False}).json()
        assert client.get(f"/v1/responses/{unstored['id']}").status_code == 404
    assert "pagedserve_gateway_stored_responses_in_memory_bytes" in metrics



def test_ids_no_response_can_have_are_404s_without_a_redis_call(tokenizer):
    """An id this gateway could not have made names no stored response: a 404 at once, even while Redis is down
    (asking Redis would make it a 503)."""
    with gateway(tokenizer, redis_url=f"redis://127.0.0.1:{free_port()}/0") as (client, _, _):
        turn = client.post("/v1/responses", json={"input": "Hi", "previous_response_id": "not-an-id"})
        unknown = client.get("/v1/responses/not-an-id")
        deleted = client.delete("/v1/responses/msg_0123abcd")
        ours = client.get("/v1/responses/resp_0123abcd")  # our shape: Redis is asked, and is down
    assert turn.status_code == 404 and turn.json()["error"]["param"] == "previous_response_id", turn.text
    assert unknown.status_code == 404 and deleted.status_code == 404
    assert ours.status_code == 503
