"""Reasoning split from the answer per family (Qwen3 opens its think block, DeepSeek-R1's prompt opens it), whole,
streamed and cut at every character; the constraint that admits free reasoning before the constrained answer; and
the chat API's reasoning fields against a fake scheduler."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest

from pagedserve.services.gateway.structured.reasoning_grammar import after_reasoning
from pagedserve.services.gateway.structured.reasoning_parsers import (
    REASONING_FORMATS,
    ReasoningSplitter,
    default_reasoning_parser,
)
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.services.gpu_worker.grammar import RequestGrammar
from pagedserve.shared.grammar_cache import GrammarCache
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.gateway.app_client import checked_gateway
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient
from tests.unit.gateway.structured.test_tools import WEATHER
from tests.unit.gateway.test_app import sse_chunks

# family -> (output, reasoning, content): outputs in each family's documented shape
SAMPLES = [
    ("qwen3", "<think>\nThe user wants the capital.\n</think>\n\nParis.", "\nThe user wants the capital.\n", "Paris."),
    ("qwen3", "Paris.", "", "Paris."),  # thinking off: the template closed an empty block in the prompt
    ("deepseek_r1", "Okay, so the capital of France.\n</think>\n\nParis.", "Okay, so the capital of France.\n",
     "Paris."),  # no opening tag: the prompt opened it
    ("deepseek_r1", "<think>Hmm.</think>Paris.", "Hmm.", "Paris."),
]


def split(family: str, text: str, pieces: int = 1) -> tuple[str, str]:
    splitter, reasoning, content = ReasoningSplitter(REASONING_FORMATS[family]), "", ""
    step = max(1, -(-len(text) // pieces))
    chunks = [text[i:i + step] for i in range(0, len(text), step)] or [""]
    for i, chunk in enumerate(chunks):
        r, c = splitter.feed(chunk, final=i == len(chunks) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content


@pytest.mark.parametrize(("family", "text", "reasoning", "content"), SAMPLES)
def test_whole_and_streamed(family, text, reasoning, content):
    for pieces in (1, 3, len(text)):
        assert split(family, text, pieces) == (reasoning, content)


@pytest.mark.parametrize(("family", "text", "reasoning", "content"), SAMPLES)
def test_every_cut_keeps_tags_out_of_both_parts(family, text, reasoning, content):
    for end in range(len(text) + 1):
        whole = split(family, text[:end])
        assert whole == split(family, text[:end], max(1, end))
        assert not any(tag in part for part in whole for tag in ("<think>", "</think>")), text[:end]
        assert reasoning.startswith(whole[0]) and content.startswith(whole[1])


def test_default_parser_from_the_template():
    assert default_reasoning_parser("{%- if enable_thinking is defined %}<think>\n\n</think>{% endif %}") == "qwen3"
    assert default_reasoning_parser("{{'<｜Assistant｜><think>\\n'}}") == "deepseek_r1"
    assert default_reasoning_parser("{{ messages }}") == ""


@pytest.fixture(scope="module")
def grammars():
    cache = GrammarCache(str(MODEL_DIR), 49152, (2,))
    yield cache
    cache.close()


@pytest.mark.parametrize("family", sorted(REASONING_FORMATS))
def test_the_constraint_applies_after_the_reasoning_only(grammars, family):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = after_reasoning(Constraint(StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(schema)),
                                            "response_format.json_schema"), REASONING_FORMATS[family])
    opening = "" if REASONING_FORMATS[family].starts_in_reasoning else "<think>"

    def accepts(text: str) -> bool:
        matcher = RequestGrammar.start(grammars.get(constraint.structured), []).matcher
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts(opening + 'Free text, even {"a": "x"} here.</think>\n\n{"a": 1}')
    assert not accepts(opening + 'Thinking.</think>\n\n{"a": "x"}')  # the answer still follows the schema
    assert not accepts('{"a": 1}')  # the reasoning block comes first


@contextmanager
def gateway(tokenizer, reply: str, **config):
    fake = FakeSchedulerClient(tokenizer, reply=reply)
    with checked_gateway(tokenizer, fake, **config) as (client, _, checker):
        yield client, fake, checker


CHAT = {"model": "tiny-model", "messages": [{"role": "user", "content": "Capital of France?"}]}
THOUGHT = "<think>\nThe capital.\n</think>\n\n"


def test_chat_reasoning_fields_whole_and_streamed(tokenizer):
    with gateway(tokenizer, THOUGHT + "Paris.", reasoning_parser="qwen3") as (client, _, _):
        whole = client.post("/v1/chat/completions", json=CHAT).json()
        chunks = sse_chunks(client.post("/v1/chat/completions", json={
            **CHAT, "stream": True, "stream_options": {"include_usage": True}}))
        off = client.post("/v1/chat/completions", json={
            **CHAT, "chat_template_kwargs": {"enable_thinking": False}}).json()
    message = whole["choices"][0]["message"]
    assert message["content"] == "Paris." and message["reasoning_content"] == message["reasoning"] == "\nThe capital.\n"
    num = len(tokenizer.encode("\nThe capital.\n", add_special_tokens=False))
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": num}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "\nThe capital.\n"
    assert "".join(d.get("content") or "" for d in deltas) == "Paris."
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": num}
    assert off["choices"][0]["message"]["content"] == THOUGHT + "Paris."  # thinking off: no split
    assert "reasoning_content" not in off["choices"][0]["message"]


def test_tool_calls_after_reasoning(tokenizer):
    reply = THOUGHT + '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    with gateway(tokenizer, reply, reasoning_parser="qwen3") as (client, _, checker):
        whole = client.post("/v1/chat/completions", json={**CHAT, "tools": [WEATHER], "tool_choice": "required"})
    message = whole.json()["choices"][0]["message"]
    assert message["reasoning_content"] == "\nThe capital.\n" and message["content"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    spec = json.loads(checker.checked[0].structured.spec)
    assert spec["format"]["type"] == "sequence" and spec["format"]["elements"][0]["begin"] == "<think>"
