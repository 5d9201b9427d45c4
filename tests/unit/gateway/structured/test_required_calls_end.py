"""`tool_choice: required` with parallel calls: after a call and a newline the answer may end (the grammar accepts
the end token there) or go on with another call; no second call is forced (issue 40)."""

from __future__ import annotations

import xgrammar as xgr
from transformers import AutoTokenizer

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest
from pagedserve.services.gateway.structured.tools import MAX_TRAILING_WHITESPACE, tool_constraint, tool_plan_of
from pagedserve.shared.grammar_cache import GrammarCache

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _matcher_after(smollm2_dir, text: str) -> tuple[xgr.GrammarMatcher, int]:
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
                                 tool_choice="required")
    constraint = tool_constraint(tool_plan_of(body))
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    cache = GrammarCache(str(smollm2_dir), len(tokenizer), (tokenizer.eos_token_id,))
    try:
        matcher = xgr.GrammarMatcher(cache.get(constraint.structured))
    finally:
        cache.close()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept_token(token), (text, tokenizer.decode([token]))
    return matcher, tokenizer.eos_token_id


def test_a_newline_after_the_last_call_may_end_the_answer(smollm2_dir):
    matcher, eos = _matcher_after(smollm2_dir, CALL + "\n")
    assert matcher.accept_token(eos) and matcher.is_terminated()


def test_the_end_may_follow_the_call_directly_and_a_second_call_is_still_allowed(smollm2_dir):
    matcher, eos = _matcher_after(smollm2_dir, CALL)
    assert matcher.accept_token(eos)
    _matcher_after(smollm2_dir, CALL + "\n" + CALL)  # parallel calls allowed: a second one parses


def test_several_newlines_after_the_last_call_may_end_the_answer(smollm2_dir):
    """SmolLM2 writes two newlines after a call: with only one allowed, the second was masked and greedy decoding
    opened a duplicate call."""
    for whitespace in ("\n\n", " \n\n", "\n" * MAX_TRAILING_WHITESPACE):
        matcher, eos = _matcher_after(smollm2_dir, CALL + whitespace)
        assert matcher.accept_token(eos) and matcher.is_terminated(), repr(whitespace)


def test_the_trailing_whitespace_is_ascii_and_bounded(smollm2_dir):
    """No Unicode spaces byte token by byte token, and no endless padding: past the bound only the end is left."""
    matcher, eos = _matcher_after(smollm2_dir, CALL + "\n" * MAX_TRAILING_WHITESPACE)
    assert not matcher.accept_string("\n") and not matcher.accept_string(" ")
    matcher, _ = _matcher_after(smollm2_dir, CALL + "\n\n")
    assert not matcher.accept_string("\u3000") and not matcher.accept_string("\u00a0")
