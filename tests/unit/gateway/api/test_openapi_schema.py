"""/openapi.json states the ranges the gateway enforces: every bound it documents is accepted at its edge and
refused (400 naming the field) just past it, so generated clients and schemathesis can trust the schema."""

from __future__ import annotations

import pytest

from tests.unit.gateway.test_app import gateway, gateway_with_state

CHAT = ("/v1/chat/completions", "ChatCompletionRequest",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
COMPLETIONS = ("/v1/completions", "CompletionRequest", {"prompt": "Paris is", "max_tokens": 1})
DETOKENIZE = ("/detokenize", "DetokenizeRequest", {})
# (endpoint, field, how a value is placed in the body, the error's param, other fields it needs)
FIELDS = [
    (CHAT, "max_tokens", lambda v: v, "max_tokens", {}),
    (CHAT, "max_completion_tokens", lambda v: v, "max_completion_tokens", {}),
    (CHAT, "min_tokens", lambda v: v, "min_tokens", {"max_tokens": None}),
    (CHAT, "temperature", lambda v: v, "temperature", {}),
    (CHAT, "top_p", lambda v: v, "top_p", {}),
    (CHAT, "top_k", lambda v: v, "top_k", {}),
    (CHAT, "min_p", lambda v: v, "min_p", {}),
    (CHAT, "seed", lambda v: v, "seed", {}),
    (CHAT, "presence_penalty", lambda v: v, "presence_penalty", {}),
    (CHAT, "frequency_penalty", lambda v: v, "frequency_penalty", {}),
    (CHAT, "repetition_penalty", lambda v: v, "repetition_penalty", {}),
    (CHAT, "n", lambda v: v, "n", {}),
    (CHAT, "top_logprobs", lambda v: v, "top_logprobs", {"logprobs": True}),
    (CHAT, "stop_token_ids", lambda v: [v], "stop_token_ids", {}),
    (CHAT, "logit_bias", lambda v: {"5": v}, "logit_bias", {}),
    (COMPLETIONS, "logprobs", lambda v: v, "logprobs", {}),
    (COMPLETIONS, "prompt", lambda v: [v], "prompt", {}),
    (DETOKENIZE, "tokens", lambda v: [v], "tokens", {}),
]


def bounds(schema: dict) -> dict:
    """The first node of `schema` (through anyOf and items) that carries a bound."""
    keys = {"minimum", "maximum", "exclusiveMinimum"}
    if keys & set(schema):
        return {key: schema[key] for key in keys & set(schema)}
    for child in [*schema.get("anyOf", []), schema.get("items"), schema.get("additionalProperties")]:
        if isinstance(child, dict) and (found := bounds(child)):
            return found
    return {}


def edges(limits: dict) -> tuple[list, list]:
    """(values on the edges, values just past them)."""
    inside, outside = [], []
    integer = all(type(v) is int for v in limits.values())
    step = 1 if integer else 1e-3
    if "minimum" in limits:
        inside.append(limits["minimum"])
        outside.append(limits["minimum"] - step)
    if "exclusiveMinimum" in limits:
        inside.append(limits["exclusiveMinimum"] + step)
        outside.append(limits["exclusiveMinimum"])
    if "maximum" in limits:
        inside.append(limits["maximum"])
        outside.append(limits["maximum"] + step)
    return inside, outside


@pytest.fixture(scope="module")
def schema(tokenizer) -> dict:
    with gateway(tokenizer) as (client, _):
        return client.get("/openapi.json").json()


@pytest.mark.parametrize("case", FIELDS, ids=[f"{c[0][1]}.{c[1]}" for c in FIELDS])
def test_every_documented_bound_is_the_one_enforced(tokenizer, schema, case):
    (path, component, base), field, place, param, extra = case
    limits = bounds(schema["components"]["schemas"][component]["properties"][field])
    assert limits, f"{component}.{field} documents no range"
    inside, outside = edges(limits)
    with gateway(tokenizer) as (client, _):
        for value in inside:
            body = {k: v for k, v in {**base, **extra, field: place(value)}.items() if v is not None}
            if field == "min_tokens":
                body["max_tokens"] = max(value, 1)
            response = client.post(path, json=body)
            error = response.json().get("error") or {}
            # a length may still not fit the context with this prompt: that is the prompt's doing, not the bound's
            assert response.status_code == 200 or error.get("code") == "context_length_exceeded", (value, error)
        for value in outside:
            body = {k: v for k, v in {**base, **extra, field: place(value)}.items() if v is not None}
            response = client.post(path, json=body)
            assert response.status_code == 400, (value, response.text)
            assert response.json()["error"]["param"].startswith(param), (value, response.json())


def test_the_schema_names_the_api_key_and_the_error_answers(tokenizer):
    with gateway_with_state(tokenizer, api_key="k") as (client, _, _state):
        schema = client.get("/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"bearer": []}]
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert {"400", "401", "413", "429", "503"} <= set(chat["responses"])
    assert "security" not in schema["paths"]["/health"]["get"]
    stop = schema["components"]["schemas"]["CompletionRequest"]["properties"]["stop"]
    assert {"type": "string", "maxLength": 256} in stop["anyOf"]
