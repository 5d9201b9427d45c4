"""Request -> SamplingParams: defaults from generation_config.json, ranges as 400s naming the field, context."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest
from pagedserve.services.gateway.api.sampling import (
    ModelLimits,
    RequestShape,
    build_sampling_params,
    load_generation_defaults,
)
from pagedserve.services.gateway.http.errors import OpenAIError

LIMITS = ModelLimits(max_model_len=100, vocab_size=1000)
CHAT = RequestShape("messages", "max_tokens", "top_logprobs")
MESSAGES = [{"role": "user", "content": "hi"}]


def build(num_prompt_tokens: int = 10, defaults: dict | None = None, choice_index: int = 0, shape=CHAT,
          logprobs: int | None = None, **fields):
    body = ChatCompletionRequest(messages=MESSAGES, **fields)
    return build_sampling_params(body, body.max_tokens, logprobs, num_prompt_tokens, choice_index, defaults or {},
                                 LIMITS, shape)


def test_generation_config_gives_defaults_the_request_overrides(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 50, "eos_token_id": 2, "do_sample": True}))
    defaults = load_generation_defaults(tmp_path)
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 50}
    params = build(defaults=defaults, temperature=0.0)
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.0, 0.9, 20, 50)


def test_missing_generation_config_means_openai_defaults(tmp_path):
    assert load_generation_defaults(tmp_path) == {}
    params = build(num_prompt_tokens=30)
    assert (params.temperature, params.top_p, params.max_tokens) == (1.0, 1.0, 70)  # the rest of the context


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 2.0}, "min_p"),
    ({"presence_penalty": 3.0}, "presence_penalty"),
    ({"logit_bias": {"5": 200.0}}, "logit_bias"),
    ({"logit_bias": {"five": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5000": 1.0}}, "logit_bias"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
])
def test_out_of_range_values_are_400_naming_the_field(fields, param):
    with pytest.raises(OpenAIError) as info:
        build(**fields)
    assert (info.value.status, info.value.param) == (400, param)


def test_max_completion_tokens_is_named_in_its_error():
    shape = RequestShape("messages", "max_completion_tokens", "top_logprobs")
    with pytest.raises(OpenAIError) as info:
        build(shape=shape, max_tokens=0)
    assert info.value.param == "max_completion_tokens"
    assert info.value.message.startswith("max_completion_tokens must be at least 1")


def test_over_the_context_names_both_numbers():
    with pytest.raises(OpenAIError) as info:
        build(num_prompt_tokens=60, max_tokens=50)
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    assert "maximum context length is 100 tokens" in info.value.message
    assert "you requested 110 tokens (60 in the messages, 50 in the completion)" in info.value.message


def test_a_prompt_filling_the_context_is_rejected_before_max_tokens():
    with pytest.raises(OpenAIError) as info:
        build(num_prompt_tokens=100)
    assert "maximum context length is 100 tokens" in info.value.message
    assert "100 input tokens" in info.value.message and info.value.param == "messages"


def test_seed_differs_per_choice_and_logprobs_pass_through():
    first, second = build(seed=7, choice_index=0, logprobs=3), build(seed=7, choice_index=1, logprobs=3)
    assert (first.seed, second.seed, first.logprobs) == (7, 8, 3)
    assert build(logit_bias={"5": -100}).logit_bias == {5: -100.0}
