"""Issue 40's tool-call counts on the real default model, 20 prompts each: `required` with parallel calls allowed
forces no duplicate call, and answers cut by max_tokens anywhere in a call return arguments that parse or no call.

Duplicates are judged token by token from the answer's logprobs, which come from the raw logits (before the
grammar's mask): the model chose a token when it is its own top-1. The token that opens each call after the first
must be the model's choice; a grammar that masked the model's second newline forced `<tool_call>` there, and so a
duplicate call. (Padding after the last call may be forced: a model that would write text on gets whitespace, then
the end.)"""

from __future__ import annotations

import re

import pytest

from tests.integration.test_structured_outputs import ARGS, TOOL_PROMPTS, TOOLS, parallel

pytestmark = pytest.mark.slow

CALL_BLOCK = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


@pytest.fixture(scope="module")
def client(client):
    """Twenty answers at once on two busy cores: the client waits longer and retries 429s, as OpenAI's do."""
    return client.with_options(timeout=900, max_retries=10)


def ask(client, model_name: str, prompt: str, **fields):
    return client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": prompt}],
                                          tools=TOOLS, tool_choice="required", temperature=0, **fields)


@pytest.fixture(scope="module")
def whole_answers(client, model_name):
    """Each prompt's greedy answer under `required`, parallel calls allowed, with each token's raw top-1."""
    return parallel(lambda prompt: ask(client, model_name, prompt, max_tokens=150, logprobs=True,
                                       top_logprobs=1).choices[0], TOOL_PROMPTS)


def tokens_of(choice) -> list[tuple[int, str, str]]:
    """(start offset, chosen token, the model's top-1 token) for each output token, the end token included."""
    out, offset = [], 0
    for item in choice.logprobs.content:
        out.append((offset, item.token, item.top_logprobs[0].token))
        offset += len(item.token)
    return out


def test_required_with_parallel_calls_forces_no_duplicate_call(whole_answers):
    counts, padding = [], []
    for choice in whole_answers:
        calls = choice.message.tool_calls
        assert calls and not choice.message.content
        for call in calls:
            ARGS[call.function.name].model_validate_json(call.function.arguments)
        text = "".join(item.token for item in choice.logprobs.content)
        blocks = [m.span() for m in CALL_BLOCK.finditer(text)]
        assert len(blocks) >= len(calls), text
        openings = [(token, top) for start, token, top in tokens_of(choice)
                    if any(start <= a < start + len(token) for a, _ in blocks[1:])]
        assert len(openings) == len(blocks) - 1, text
        forced = [(token, top) for token, top in openings if token != top]
        assert not forced, (text, forced)  # each later call was opened by the model's own choice
        counts.append(len(calls))
        padding.append(sum(token != top for start, token, top in tokens_of(choice) if start >= blocks[-1][1]))
    print("calls per answer:", counts, "forced tokens after the last call:", padding)


def cut_points(choice) -> int:
    """The number of output tokens up to the end of the answer's first call."""
    text = ""
    for i, item in enumerate(choice.logprobs.content):
        text += item.token
        if "</tool_call>" in text:
            return i + 1
    raise AssertionError(f"no whole call in {text!r}")


def streamed(client, model_name: str, prompt: str, max_tokens: int) -> tuple[str, list[tuple[str, str]], str]:
    """(content, calls as (name, arguments), finish reason) of a streamed answer, reassembled from its deltas."""
    content, calls, finish = "", {}, ""
    for chunk in ask(client, model_name, prompt, max_tokens=max_tokens, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                calls.setdefault(delta.index, [delta.function.name, ""])[1] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [tuple(calls[i]) for i in sorted(calls)], finish


def test_20_answers_cut_inside_a_call_have_0_unparsable_arguments(client, model_name, whole_answers):
    """The cuts spread over each prompt's first call, from its first tokens to just before its closing `>`."""
    cuts = [max(1, cut_points(choice) - 1 - i * cut_points(choice) // len(TOOL_PROMPTS))
            for i, choice in enumerate(whole_answers)]
    jobs = list(zip(TOOL_PROMPTS, cuts, strict=True))
    whole = parallel(lambda job: ask(client, model_name, job[0], max_tokens=job[1]).choices[0], jobs)
    streams = parallel(lambda job: streamed(client, model_name, *job), jobs)
    returned = 0
    for choice, (content, calls, finish) in zip(whole, streams, strict=True):
        assert choice.finish_reason == finish == "length"
        assert not choice.message.content and not content  # no markup leaks into content
        for call in choice.message.tool_calls or []:
            ARGS[call.function.name].model_validate_json(call.function.arguments)
        assert calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        returned += bool(calls)
    print("cuts:", cuts, "answers with a call:", returned)
    assert 0 < returned < len(jobs)  # cuts after the arguments keep the call, earlier ones drop it
