"""Tool calls parsed from each family's text: whole, streamed in any pieces, and cut at every character.

The samples are written in each family's documented output format (Hermes / Qwen 2.5, Llama 3.1 JSON, Mistral v3
and v11 [TOOL_CALLS], Qwen3-Coder XML), with the text a model writes around its calls."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedserve.services.gateway.api.protocol import FunctionDefinition
from pagedserve.services.gateway.structured.tool_parser import ToolCallParser, parse_tool_calls
from pagedserve.services.gateway.structured.tool_parsers import TOOL_CALL_FORMATS, default_tool_call_parser

FUNCTIONS = [FunctionDefinition(name="get_weather", parameters={
                 "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "array"}}}),
             FunctionDefinition(name="get_time", parameters={"type": "object", "properties": {}})]
WEATHER = ("get_weather", {"city": "Paris — Île", "days": [1, 2]})
TIME = ("get_time", {})

# family -> (text, expected content, expected calls)
SAMPLES = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris — Île", "days": [1, 2]}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', None, [WEATHER, TIME]),
        ('Let me look.\n<tool_call>\n{"arguments": {}, "name": "get_time"}\n</tool_call>\nDone.',
         "Let me look.Done.", [TIME]),
        ("  Paris is the capital.\n", "  Paris is the capital.\n", []),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris — Île", "days": [1, 2]}}; '
         '{"name": "get_time", "parameters": {}}', None, [WEATHER, TIME]),
        ('<|python_tag|>{"name": "get_time", "parameters": {}}', None, [TIME]),
        ('The answer is {"a": 1} in JSON.', 'The answer is {"a": 1} in JSON.', []),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris — Île", "days": [1, 2]}}, '
         '{"name": "get_time", "arguments": {}}]', None, [WEATHER, TIME]),
        ('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris — Île", "days": [1, 2]}'
         '[TOOL_CALLS]get_time[ARGS]{}', "Checking.", [WEATHER, TIME]),
    ],
    "qwen3_coder": [
        ("I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis — Île\n</parameter>\n"
         "<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
         "</function>\n</tool_call>", "I will check.", [WEATHER, TIME]),
    ],
}
MARKUP = ("<tool_call", "</tool_call", "tool_call>", '{"name"', "<|python_tag|>", "[TOOL_CALLS", "[ARGS]",
          "<function=", "</function", "<parameter=", "</parameter")
CASES = [(family, *sample) for family, samples in SAMPLES.items() for sample in samples]


def fmt(family: str):
    return TOOL_CALL_FORMATS[family](FUNCTIONS)


def streamed(family: str, text: str, cuts: list[int]) -> tuple[str, list[dict]]:
    """Feed the text in pieces cut at `cuts`; reassemble content and calls from the deltas as a client does."""
    parser, content, calls = ToolCallParser(fmt(family)), [], {}
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [""]
    for i, piece in enumerate(pieces):
        text_out, deltas = parser.feed(piece, final=i == len(pieces) - 1)
        content.append(text_out)
        for delta in deltas:
            if delta.id is not None:
                assert delta.index not in calls and delta.arguments == ""
                calls[delta.index] = {"id": delta.id, "name": delta.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.arguments
    return "".join(content), [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize(("family", "text", "content", "expected"), CASES)
def test_whole_answers(family, text, content, expected):
    got_content, calls = parse_tool_calls(text, fmt(family))
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(n, a) for n, a in expected]
    assert len({c.id for c in calls}) == len(calls) and all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize(("family", "text", "content", "expected"), CASES)
def test_every_prefix_gives_whole_calls_or_none_and_no_markup(family, text, content, expected):
    """A cut at any character (max_tokens) yields calls whose arguments parse, a prefix of the whole answer's calls,
    and content without any of the calls' markup; streamed one character at a time gives the same."""
    whole = [(n, a) for n, a in expected]
    for end in range(len(text) + 1):
        prefix = text[:end]
        got_content, calls = parse_tool_calls(prefix, fmt(family))
        parsed = [(c.name, json.loads(c.arguments)) for c in calls]
        assert parsed == whole[:len(parsed)], prefix
        if expected:
            assert not any(m in (got_content or "") for m in MARKUP), prefix
        stream_content, stream_calls = streamed(family, prefix, list(range(end)))
        assert stream_content == (got_content or "")
        assert [(c["name"], json.loads(c["arguments"])) for c in stream_calls] == parsed


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CASES), st.lists(st.integers(min_value=0, max_value=400), max_size=40))
def test_any_pieces_reassemble_to_the_whole_parse(case, cuts):
    family, text, _, _ = case
    whole_content, whole_calls = parse_tool_calls(text, fmt(family))
    content, calls = streamed(family, text, cuts)
    assert content == (whole_content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole_calls]


def test_the_issue_cut_call_is_dropped_not_half_parsed():
    """Issue 40: arguments came back as `{"city": "Paris"}}\\n</tool_call`."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_tool_calls(text[:-1], fmt("hermes"))
    assert content is None and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert parse_tool_calls('<tool_call>\n{"name": "get', fmt("hermes")) == (None, [])


def test_malformed_blocks_are_dropped_not_content():
    assert parse_tool_calls("<tool_call>not json</tool_call>ok", fmt("hermes")) == ("ok", [])
    assert parse_tool_calls("<tool_call>\n<function=f>\n</tool_call>", fmt("qwen3_coder")) == (None, [])


def test_qwen3_coder_values_follow_the_schema():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n[3]\n"
            "</parameter>\n</function>\n</tool_call>")
    _, calls = parse_tool_calls(text, fmt("qwen3_coder"))
    assert json.loads(calls[0].arguments) == {"city": "42", "days": [3]}  # city is a string in the schema


@pytest.mark.parametrize(("template", "family"), [
    ("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}", "hermes"),
    ("<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>", "qwen3_coder"),
    ("{{ '[TOOL_CALLS]' }}", "mistral"),
    ("{{- '<|python_tag|>' }}", "llama3_json"),
    ("[TOOL_CALLS] <|python_tag|>", "hermes"),  # ambiguous
    (None, "hermes"),
])
def test_default_parser_from_the_template(template, family):
    assert default_tool_call_parser(template) == family
