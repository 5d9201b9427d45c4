"""Tool calls parsed from the model's text: whole and streamed in any pieces give the same calls and content."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.structured.tool_parser import ToolCallParser, parse_tool_calls

TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def streamed(text: str, cuts: list[int]) -> tuple[str, list[dict]]:
    """Feed the text in pieces cut at `cuts`; reassemble content and calls from the deltas as a client does."""
    parser, content, calls = ToolCallParser(), [], {}
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


def test_two_calls_whole():
    content, calls = parse_tool_calls(TWO_CALLS)
    assert content is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]}), ("get_time", {})]
    assert calls[0].arguments == '{"city": "Paris", "days": [1, 2]}'  # as the model wrote it
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id


def test_text_around_calls_is_content_without_the_whitespace_next_to_blocks():
    content, calls = parse_tool_calls("Let me look.\n" + TWO_CALLS + "\nDone.")
    assert content == "Let me look.Done." and len(calls) == 2


def test_a_plain_answer_is_kept_as_it_is():
    assert parse_tool_calls("  Paris is the capital.\n") == ("  Paris is the capital.\n", [])
    assert parse_tool_calls("a < b and <tool") == ("a < b and <tool", [])


def test_other_key_order_and_broken_blocks():
    content, calls = parse_tool_calls('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>')
    assert content is None and (calls[0].name, json.loads(calls[0].arguments)) == ("f", {"x": 1})
    content, calls = parse_tool_calls("<tool_call>not json</tool_call>")
    assert content == "<tool_call>not json</tool_call>" and calls == []


def test_a_truncated_call_keeps_what_was_written():
    content, calls = parse_tool_calls('<tool_call>\n{"name": "f", "arguments": {"city": "Par')
    assert content is None and calls[0].arguments == '{"city": "Par'


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=400), max_size=40),
       st.sampled_from(["", "Sure. ", "text <tool_ca then more\n"]), st.sampled_from(["", "\n", " after"]))
def test_any_pieces_reassemble_to_the_whole_parse(cuts, before, after):
    text = before + TWO_CALLS + after
    whole_content, whole_calls = parse_tool_calls(text)
    content, calls = streamed(text, cuts)
    assert content == (whole_content or "")
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
