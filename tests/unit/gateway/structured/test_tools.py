"""Tools in the prompt (templates with and without tool support) and in the grammar."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.tool_parser import parse_tool_calls
from pagedserve.services.gateway.structured.tool_parsers import TOOL_CALL_FORMATS
from pagedserve.services.gateway.structured.tool_parsers.hermes import HermesFormat
from pagedserve.services.gateway.structured.tools import (
    MAX_TRAILING_WHITESPACE,
    template_messages,
    tool_constraint,
    tool_plan_of,
)
from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.shared.grammar_cache import GrammarCache
from tests.unit.gateway.conftest import MODEL_DIR

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ROUND_TRIP = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": None, "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
              {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}]


format_call = HermesFormat([]).format_call


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


@pytest.fixture(scope="module")
def grammars():
    cache = GrammarCache(str(MODEL_DIR), 49152, (2,))
    yield cache
    cache.close()


def accepts(grammars: GrammarCache, body: ChatCompletionRequest, text: str, parser: str = "hermes") -> bool:
    matcher = RequestGrammar.start(grammars.get(tool_constraint(tool_plan_of(body, parser)).structured), []).matcher
    return matcher.accept_string(text) and matcher.is_completed()


def test_templates_without_tools_get_a_system_section_and_text_turns(tokenizer):
    body = chat(messages=ROUND_TRIP, tools=[WEATHER, TIME])
    messages, tools = template_messages(body.messages, [t.function for t in body.tools], native_tools=False)
    assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "<tools>" in messages[0]["content"] and '"name": "get_time"' in messages[0]["content"]
    assert messages[2]["content"] == format_call("get_weather", {"city": "Paris"})
    assert messages[3]["content"] == ('<tool_response>\n{"celsius": 21}\n</tool_response>\n'
                                      "<tool_response>\nsunny\n</tool_response>")
    text = tokenizer.tokenizer.decode(tokenizer.chat_prompt_ids(messages, tools))
    assert "<tool_call>" in text and text.endswith("<|im_start|>assistant\n")


def test_a_system_message_gets_the_section_appended():
    body = chat(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}],
                tools=[WEATHER])
    messages, _ = template_messages(body.messages, [t.function for t in body.tools], native_tools=False)
    assert messages[0]["content"].startswith("Be brief.\n\n# Tools") and len(messages) == 2


def test_templates_with_tools_get_native_fields():
    body = chat(messages=ROUND_TRIP, tools=[WEATHER])
    messages, tools = template_messages(body.messages, [t.function for t in body.tools], native_tools=True)
    assert tools == [WEATHER]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert messages[2] == {"role": "tool", "content": '{"celsius": 21}', "tool_call_id": "call_1"}


def test_plain_conversations_are_unchanged():
    body = chat()
    assert template_messages(body.messages, [], native_tools=False) == ([{"role": "user", "content": "hi"}], None)


def test_tool_choice_modes_and_their_errors():
    assert tool_plan_of(chat()) is None
    assert tool_plan_of(chat(tools=[WEATHER])).choice == "auto"
    named = tool_plan_of(chat(tools=[WEATHER, TIME],
                              tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert (named.choice, named.named, named.finish_reason) == ("named", "get_time", "stop")
    assert tool_constraint(tool_plan_of(chat(tools=[WEATHER], tool_choice="none"))) is None
    for fields, param in [({"tool_choice": "required"}, "tool_choice"),
                          ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                           "tool_choice"),
                          ({"tools": [WEATHER, WEATHER]}, "tools"),
                          ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
                              "type": "object", "properties": {"a": {"not": {}}}}}}]},
                           "tools[0].function.parameters")]:
        with pytest.raises(OpenAIError) as info:
            tool_plan_of(chat(**fields))
        assert info.value.param == param


def test_required_allows_calls_only_and_their_arguments_must_match(grammars):
    body = chat(tools=[WEATHER, TIME], tool_choice="required")
    one = format_call("get_weather", {"city": "Paris"})
    assert accepts(grammars, body, one)
    assert accepts(grammars, body, one + "\n" + format_call("get_time", {}))
    assert not accepts(grammars, body, "Sure! " + one)  # no text
    assert not accepts(grammars, body, format_call("get_weather", {"town": "Paris"}))  # wrong arguments
    assert not accepts(grammars, body, "")  # at least one call
    single = chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    assert not accepts(grammars, single, one + "\n" + format_call("get_time", {}))


def test_named_forces_that_function_and_auto_allows_text(grammars):
    named = chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert accepts(grammars, named, format_call("get_weather", {"city": "Oslo"}))
    assert not accepts(grammars, named, format_call("get_time", {}))
    auto = chat(tools=[WEATHER, TIME])
    assert accepts(grammars, auto, "It is sunny.")
    assert accepts(grammars, auto, "Let me check. " + format_call("get_time", {}))
    assert not accepts(grammars, auto, '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>')


def test_tool_grammar_json_is_compact(grammars):
    body = chat(tools=[WEATHER], tool_choice="required")
    assert not accepts(grammars, body, '<tool_call>\n{"name": "get_weather", "arguments": {  "city": "P"}}\n'
                                       "</tool_call>")
    spec = json.loads(tool_constraint(tool_plan_of(body)).structured.spec)
    calls = spec["format"]["elements"][0]
    assert calls["type"] == "tags_with_separator" and calls["at_least_one"]


def test_a_newline_after_the_last_call_does_not_force_another_call(grammars):
    """Issue 40: `required` with parallel calls returned every call twice, as a newline forced another call."""
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        body = chat(tools=[WEATHER, TIME], tool_choice=choice)
        call = format_call("get_weather", {"city": "Paris"})
        assert accepts(grammars, body, call + "\n") and accepts(grammars, body, call + "\n\n")  # SmolLM2 writes 2
        assert not accepts(grammars, body, call + "\n" * (MAX_TRAILING_WHITESPACE + 1))  # no endless padding


@pytest.mark.parametrize("parser", sorted(TOOL_CALL_FORMATS))
def test_each_family_grammar_admits_its_calls_and_the_parser_reads_them_back(grammars, parser):
    call_format = TOOL_CALL_FORMATS[parser](tool_plan_of(chat(tools=[WEATHER, TIME])).functions)
    weather, time = call_format.format_call("get_weather", {"city": "Paris"}), call_format.format_call("get_time", {})
    two = weather + call_format.separator + time
    required = chat(tools=[WEATHER, TIME], tool_choice="required")
    assert accepts(grammars, required, weather, parser) and accepts(grammars, required, two, parser)
    assert not accepts(grammars, required, "Sure. " + weather, parser)
    named = chat(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert accepts(grammars, named, time, parser) and not accepts(grammars, named, weather, parser)
    auto = chat(tools=[WEATHER, TIME])
    assert accepts(grammars, auto, "It is sunny.", parser)
    content, calls = parse_tool_calls(two, call_format)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
