"""A thinking model through the whole stack: a tiny random Qwen3 (built here from transformers' Qwen3Config, the
SmolLM2 tokenizer plus <think> / </think>) with Qwen3's real chat template, so the reasoning parser is the template's
default (qwen3). Random weights write no think block of their own, so the tests steer them with logit_bias where
they need one; what is checked is the server's split, the template switch and the grammar after the reasoning."""

from __future__ import annotations

import json
import os

import httpx
import pytest
from openai import OpenAI

from tests.integration.conftest import STARTUP_TIMEOUT_S, _stop
from tests.integration.processes import MODEL_DIR, RedisServer, TraceCollector, start_stack
from tests.integration.qwen3_chat_template import QWEN3_CHAT_TEMPLATE

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": False}  # no strings: </think> cannot hide in one


def build_tiny_qwen3(directory) -> dict[str, int]:
    """A random 2-layer Qwen3 with a tokenizer that knows <think> and </think>; returns their token ids."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    tokenizer.add_tokens(["<think>", "</think>"])  # plain added tokens, as in Qwen3's tokenizer
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, torch_dtype="float32")
    Qwen3ForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return {"<think>": tokenizer.convert_tokens_to_ids("<think>"),
            "</think>": tokenizer.convert_tokens_to_ids("</think>")}


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    tmp_dir = tmp_path_factory.mktemp("qwen3")
    ids = build_tiny_qwen3(tmp_dir / "tiny-qwen3")
    redis_server = RedisServer(tmp_dir / "redis.log")
    redis_server.start()
    collector = TraceCollector()
    collector.server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    running = start_stack(tmp_dir, redis_server, collector, env, model_dir=tmp_dir / "tiny-qwen3",
                          extra_args=("--kv-cache-memory-bytes", "64MiB"))
    try:
        running.wait_healthy(STARTUP_TIMEOUT_S)
        client = OpenAI(base_url=running.base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        yield running, client, model, ids
    finally:
        _stop(running)
        redis_server.kill()
        collector.server.stop(0)


MESSAGES = [{"role": "user", "content": "Is the sky blue?"}]


def test_json_schema_after_thinking_parses_and_the_reasoning_is_split(qwen3):
    """The grammar forces <think>, leaves the reasoning free up to </think> (made likely, not certain, by a bias),
    then forces the schema: reasoning_content holds the free text and content parses."""
    stack, client, model, ids = qwen3
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model, messages=MESSAGES, max_tokens=300, temperature=1.0, seed=seed,
            logit_bias={str(ids["</think>"]): 8},
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
        message = answer.choices[0].message
        assert answer.choices[0].finish_reason == "stop", (message, stack.log_tail())
        assert set(json.loads(message.content)) == {"ok", "n"}
        reasoning = message.model_extra["reasoning_content"]
        assert message.model_extra["reasoning"] == reasoning
        assert "<think>" not in (reasoning or "") and "</think>" not in (reasoning or "")
        details = answer.usage.completion_tokens_details
        assert details is not None and details.reasoning_tokens == (
            len(httpx.post(stack.base_url + "/tokenize", json={"prompt": reasoning, "add_special_tokens": False})
                .json()["tokens"]) if reasoning else 0)


def test_streamed_reasoning_and_answer_equal_the_whole_ones(qwen3):
    stack, client, model, ids = qwen3
    fields = dict(model=model, messages=MESSAGES, max_tokens=300, temperature=1.0, seed=7,
                  logit_bias={str(ids["</think>"]): 8},
                  response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})
    whole = client.chat.completions.create(**fields).choices[0].message
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(**fields, stream=True):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (reasoning or None, content) == (whole.model_extra["reasoning_content"], whole.content)


def test_enable_thinking_false_reaches_the_template_and_turns_the_split_off(qwen3):
    stack, client, model, ids = qwen3
    on = httpx.post(stack.base_url + "/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    off = httpx.post(stack.base_url + "/tokenize", json={
        "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False}}).json()["tokens"]
    assert off[:len(on)] == on and ids["<think>"] in off[len(on):] and ids["</think>"] in off[len(on):]
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0.0, logit_bias={str(ids["</think>"]): 100},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = answer.choices[0].message
    assert "reasoning_content" not in (message.model_extra or {})  # no split: the answer is all content
    assert message.content.startswith("</think>")
