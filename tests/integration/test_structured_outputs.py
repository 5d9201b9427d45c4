"""Structured outputs and tool calls through the real services with the real `openai` client."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

CONCURRENCY = 8
CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Rome", "Seoul", "Dakar"]
DISHES = ["pancakes", "lentil soup", "pad thai", "a caesar salad", "guacamole", "risotto", "banana bread",
          "falafel", "a tomato omelette", "chili", "gazpacho", "ramen", "hummus", "apple pie", "paella",
          "a green smoothie", "tacos", "shakshuka", "pesto pasta", "miso soup"]


NAME = r"^[A-Za-z][A-Za-z ,'-]{0,39}$"  # plain words: a character is a token or less (a katakana one is 3)


class Recipe(BaseModel):
    """Every part is bounded in tokens, so the grammar ends well inside max_tokens."""

    name: str = Field(pattern=NAME)
    servings: int = Field(ge=1, le=12)
    vegetarian: bool
    cuisine: Literal["italian", "french", "indian", "asian", "american", "other"]
    ingredients: list[Annotated[str, Field(pattern=NAME)]] = Field(min_length=1, max_length=4)


class WeatherArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=40)
    unit: Literal["celsius", "fahrenheit"]


class FlightArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    origin: str = Field(max_length=40)
    destination: str = Field(max_length=40)
    passengers: int = Field(ge=1, le=9)


ARGS = {"get_weather": WeatherArgs, "book_flight": FlightArgs}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": WeatherArgs.model_json_schema()}},
         {"type": "function", "function": {"name": "book_flight", "description": "Book a flight between two cities",
                                           "parameters": FlightArgs.model_json_schema()}}]
TOOL_PROMPTS = ([f"What is the weather like in {city} right now?" for city in CITIES]
                + [f"Book me a flight from {a} to {b} for two people." for a, b in zip(CITIES, CITIES[1:] + CITIES[:1],
                                                                                         strict=True)])


@pytest.fixture(scope="module")
def client(client):
    """Twenty answers at once can take minutes on two busy cores, and the scheduler may refuse some with 429 +
    Retry-After while its predicted queue is long: the client waits and retries, as OpenAI's clients do."""
    return client.with_options(timeout=900, max_retries=10)


def parallel(function, items: list) -> list:
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(function, items))


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "top_p": 0.95}],
                         ids=["greedy", "sampled"])
def test_parse_with_a_pydantic_model_gives_20_valid_objects(client, model_name, sampling):
    def ask(i: int):
        return client.chat.completions.parse(
            model=model_name, messages=[{"role": "user", "content": f"Give me a recipe for {DISHES[i]}."}],
            response_format=Recipe, max_tokens=300, seed=i, **sampling)

    completions = parallel(ask, list(range(20)))
    for completion in completions:
        choice = completion.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        assert isinstance(choice.message.parsed, Recipe)  # parse() validated it against the model
    print([c.choices[0].message.parsed.name for c in completions])


def test_json_object_output_parses(client, model_name):
    prompts = ["Return a JSON object with the name and age of a person.",
               "Output a JSON object with a title and an author of a book.",
               "Create a JSON object for a car with make and model."]

    def ask(prompt: str) -> str:
        completion = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": prompt}], response_format={"type": "json_object"},
            temperature=0, max_tokens=120)
        assert completion.choices[0].finish_reason == "stop"
        return completion.choices[0].message.content

    for text in parallel(ask, prompts):
        assert isinstance(json.loads(text), dict), text


def test_a_json_schema_streams_to_valid_json_and_completions_take_constraints_too(client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "A recipe for soup, please."}], stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "recipe", "schema": Recipe.model_json_schema(),
                                                                "strict": True}},
        temperature=0, max_tokens=300)
    Recipe.model_validate_json("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
    choice = client.completions.create(model=model_name, prompt="Is water wet? Answer:", temperature=0, max_tokens=5,
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}}).choices[0]
    assert choice.text in ("yes", "no")
    year = client.completions.create(model=model_name, prompt="The Eiffel tower was finished in the year",
                                     temperature=0, max_tokens=8, extra_body={"guided_regex": " [12][0-9]{3}"})
    assert year.choices[0].text.strip().isdigit() and len(year.choices[0].text) == 5


def streamed_call(client, model_name: str, prompt: str) -> tuple[list[tuple[str, str]], str]:
    """The calls of a streamed answer, reassembled from OpenAI-shaped deltas, and its finish reason."""
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=150, stream=True)
    calls: dict[int, list[str]] = {}
    finish = ""
    for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.content
            for delta in choice.delta.tool_calls or []:
                if delta.id is not None:  # a call's first delta: id, type and name, no arguments yet
                    assert delta.type == "function" and delta.function.arguments == "" and delta.index not in calls
                    calls[delta.index] = [delta.function.name, ""]
                else:
                    assert delta.function.name is None
                calls[delta.index][1] += delta.function.arguments
            finish = choice.finish_reason or finish
    return [tuple(calls[i]) for i in sorted(calls)], finish


def test_required_tool_calls_are_valid_for_20_prompts_streamed_and_not(client, model_name):
    def whole(prompt: str):
        return client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=0, max_tokens=150).choices[0]

    choices = parallel(whole, TOOL_PROMPTS)
    streamed = parallel(lambda prompt: streamed_call(client, model_name, prompt), TOOL_PROMPTS)
    for choice, (stream_calls, stream_finish) in zip(choices, streamed, strict=True):
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        [call] = choice.message.tool_calls
        assert call.id.startswith("call_") and call.type == "function"
        ARGS[call.function.name].model_validate_json(call.function.arguments)  # valid for its function
        assert stream_finish == "tool_calls"
        assert stream_calls == [(call.function.name, call.function.arguments)]
    names = [c.message.tool_calls[0].function.name for c in choices]
    print(list(zip(names, [c.message.tool_calls[0].function.arguments for c in choices], strict=True)))
    assert set(names) == set(ARGS)  # the model picks between the functions


def test_a_named_tool_and_parallel_calls(client, model_name):
    named = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Hello!"}], tools=TOOLS, temperature=0,
        tool_choice={"type": "function", "function": {"name": "book_flight"}}, max_tokens=150).choices[0]
    assert named.finish_reason == "stop"  # as OpenAI answers a forced function
    [call] = named.message.tool_calls
    assert call.function.name == "book_flight"
    FlightArgs.model_validate_json(call.function.arguments)
    several = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Weather in Paris and in Rome?"}], tools=TOOLS,
        tool_choice="required", temperature=0, max_tokens=300).choices[0]
    assert several.message.tool_calls and several.finish_reason in ("tool_calls", "length")
    for call in several.message.tool_calls:  # a call cut by max_tokens is dropped, never returned half
        ARGS[call.function.name].model_validate_json(call.function.arguments)


def test_required_calls_are_whole_and_cut_calls_parse(client, model_name):
    """Issue 40: a call cut by max_tokens came back with arguments that did not parse, or as markup in content; and
    with parallel calls allowed every answer holds at least one whole, valid call. (That newlines after the last
    call no longer force another is shown from the raw logprobs in test_tool_call_cuts.py, and token by token in
    tests/unit/gateway/structured/test_required_calls_end.py.)"""
    def whole(prompt: str, max_tokens: int = 150):
        return client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": prompt}], tools=TOOLS, tool_choice="required",
            temperature=0, max_tokens=max_tokens).choices[0]

    choices = parallel(whole, TOOL_PROMPTS)
    for choice in choices:
        assert choice.message.tool_calls and not choice.message.content
        for call in choice.message.tool_calls:
            ARGS[call.function.name].model_validate_json(call.function.arguments)
    print("calls per answer:", [len(c.message.tool_calls) for c in choices])
    cut = parallel(lambda n: whole(TOOL_PROMPTS[n % len(TOOL_PROMPTS)], 5 + n), list(range(20)))
    for choice in cut:
        assert not choice.message.content  # no call markup leaks into content
        for call in choice.message.tool_calls or []:
            ARGS[call.function.name].model_validate_json(call.function.arguments)
    assert sum(c.finish_reason == "length" for c in cut) >= 10


def test_a_tool_result_round_trip(client, model_name, stack):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.chat.completions.create(
        model=model_name, messages=[question], tools=TOOLS, temperature=0, max_tokens=150,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    conversation = [question, first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    answer = client.chat.completions.create(model=model_name, messages=conversation, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=40)
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens
    tokens = httpx.post(stack.base_url + "/tokenize", json={"messages": conversation, "tools": TOOLS}).json()["tokens"]
    prompt = httpx.post(stack.base_url + "/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert '<tool_response>\n{"temperature": 21, "sky": "sunny"}\n</tool_response>' in prompt
    assert f'<tool_call>\n{{"name": "get_weather", "arguments": {call.function.arguments}}}\n</tool_call>' in prompt
    assert len(tokens) == answer.usage.prompt_tokens  # /tokenize renders tools and tool turns as chat does


def test_bad_grammars_are_400s_naming_the_field(client, model_name):
    messages = [{"role": "user", "content": "hi"}]
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
         "response_format.json_schema", "nonsense"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": {
            "type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema", "uniqueItems"),
        ({"extra_body": {"structured_outputs": {"regex": "a(b"}}}, "structured_outputs.regex", "regex"),
        ({"extra_body": {"structured_outputs": {"grammar": "root ::= undefined_rule"}}}, "structured_outputs.grammar",
         "undefined_rule"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
        # issue 40: grammars that match nothing were dropped by the worker and answered with free text
        ({"extra_body": {"structured_outputs": {"grammar": "root ::= root"}}}, "structured_outputs.grammar",
         "matches no text"),
        ({"extra_body": {"structured_outputs": {"regex": r"[^\s\S]"}}}, "structured_outputs.regex", "matches no text"),
    ]
    for fields, param, words in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model_name, messages=messages, max_tokens=5, **fields)
        error = info.value.body
        assert error["param"] == param and words in error["message"], error


def test_a_grammar_too_slow_to_compile_is_refused_while_others_run(client, model_name):
    """A 20000-long bounded repetition compiles for minutes: refused after the gateway's 10 s limit (the worker
    never sees it), while other requests run, one of them under a grammar the gateway already knows."""
    slow = {"type": "string", "pattern": "^[a-z]{20000}$"}
    known = {"structured_outputs": {"regex": "[0-9, ]+"}}
    client.completions.create(model=model_name, prompt="1, 2,", max_tokens=2, extra_body=known)
    outcome: dict = {}

    def ask_slow() -> None:
        start_s = time.monotonic()
        try:
            client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"structured_outputs": {"json": slow}}, max_tokens=5)
        except openai.BadRequestError as exc:
            outcome.update(error=exc.body, seconds=time.monotonic() - start_s)

    thread = threading.Thread(target=ask_slow)
    thread.start()
    others = parallel(lambda i: client.completions.create(
        model=model_name, prompt=f"Count to {i + 3}: 1,", temperature=0, max_tokens=12,
        extra_body=known if i % 2 else {}), range(4))
    thread.join(120)
    assert outcome["error"]["param"] == "structured_outputs.json", outcome
    assert "did not compile within 10 s" in outcome["error"]["message"]
    assert all(o.choices[0].finish_reason in ("stop", "length") for o in others)
    assert all(set(o.choices[0].text) <= set("0123456789, ") for o in others[1::2])
    print(f"slow grammar refused after {outcome['seconds']:.1f} s")
