"""A thinking model's answer with tool calls through both parsers (chat_answer.ChoiceAnswer: reasoning first, then
calls), cut at every byte of its UTF-8 text as max_tokens may cut it: each prefix yields whole calls whose arguments
parse (a prefix of the full answer's calls) or none, no think or call markup in `reasoning` or `content`, and the
stream fed one character at a time gives what the whole prefix gives.

The outputs follow each family's documented shapes: Qwen3 (opens its own think block, then Hermes calls) and
DeepSeek-R1 (the prompt opens the think block, so the output has only the closing tag)."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.structured.chat_answer import AnswerParsing, ChoiceAnswer
from pagedserve.services.gateway.structured.reasoning_parsers import REASONING_FORMATS
from pagedserve.services.gateway.structured.tools import ToolPlan
from tests.unit.gateway.structured.test_tool_parser import FUNCTIONS, MARKUP, fmt

CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris — Île", "days": [1, 2]}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
WHOLE_CALLS = [("get_weather", {"city": "Paris — Île", "days": [1, 2]}), ("get_time", {})]
# (reasoning family, tool_choice, recorded output, its reasoning)
OUTPUTS = [
    ("qwen3", "auto", "<think>\nParis — weather and time.\n</think>\n\n" + CALLS, "\nParis — weather and time.\n"),
    ("qwen3", "required", "<think>\nTwo calls.\n</think>\n\n" + CALLS, "\nTwo calls.\n"),
    ("deepseek_r1", "auto", "Okay, so Île de France.\n</think>\n\n" + CALLS, "Okay, so Île de France.\n"),
]
TAGS = ("<think>", "</think>", *MARKUP)
# Under auto, an answer that ends in a lone "<" keeps it as content: one character does not open a call
# (tool_parser.MIN_CUT_TRIGGER); under required, the answer holds calls only.
LONE_CHARACTER = ("", "<")


def answer(family: str, choice: str, text: str, pieces: list[str]) -> tuple[str, str, list]:
    plan = ToolPlan(FUNCTIONS, choice, None, True, fmt("hermes"))
    parsed = ChoiceAnswer(AnswerParsing(plan, REASONING_FORMATS[family]))
    reasoning = ""
    for i, piece in enumerate(pieces):
        r, _, _ = parsed.feed(piece, final=i == len(pieces) - 1)
        reasoning += r
    calls = [(call.name, json.loads(call.arguments)) for call in parsed.calls.calls]
    return reasoning, parsed.content, calls


@pytest.mark.parametrize(("family", "choice", "text", "reasoning"), OUTPUTS)
def test_every_byte_cut_gives_whole_calls_or_none_and_no_markup(family, choice, text, reasoning):
    data = text.encode()
    assert answer(family, choice, text, [text]) == (reasoning, "", WHOLE_CALLS)
    for end in range(len(data) + 1):
        prefix = data[:end].decode(errors="ignore")  # the detokenizer holds back a cut character's bytes
        got_reasoning, content, calls = answer(family, choice, prefix, [prefix])
        assert calls == WHOLE_CALLS[:len(calls)], prefix
        assert not any(tag in part for part in (got_reasoning, content) for tag in TAGS), prefix
        assert reasoning.startswith(got_reasoning), prefix
        assert content in (LONE_CHARACTER if choice == "auto" else ("",)), prefix
        assert answer(family, choice, prefix, list(prefix) or [""]) == (got_reasoning, content, calls), prefix
