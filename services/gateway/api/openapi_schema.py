"""The gateway's /openapi.json with what the gateway enforces written in: value ranges of the request fields, the
API key, and the OpenAI-shaped error answers. Generated clients and fuzzers (schemathesis) read it; the checks
themselves live in protocol.py, sampling.py and shared/sampling_params.py (whose number ranges, in
shared/sampling_bounds.py, are documented here from the same constants); a test keeps them in step."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from pagedserve.services.gateway.api.protocol import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from pagedserve.services.gateway.api.sampling import MAX_LOGPROBS
from pagedserve.shared.sampling_bounds import NUMBER_RANGES
from pagedserve.shared.sampling_params import INT32_MAX, INT64_MAX, INT64_MIN, UINT32_MAX
from pagedserve.shared.step_protocol import ModelDescription

_TOKEN_ID_FIELDS = ("prompt", "tokens", "stop_token_ids")
_ERROR_STATUSES = {400: "Bad request: the message names the field (`param`)", 401: "Missing or wrong API key",
                   404: "Unknown model", 413: "Request body over --max-body-bytes",
                   429: "Too many open requests, or the scheduler is overloaded: retry after `Retry-After` seconds",
                   503: "Not ready or draining: retry after `Retry-After` seconds"}
_ERROR_SCHEMA = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}


def _integer_bounds(max_num_choices: int, model: ModelDescription | None) -> dict[str, tuple[int, int]]:
    """Token ids and lengths as the served model bounds them (the wire's limits before it is described)."""
    token_id_max = model.vocab_size - 1 if model else INT32_MAX
    max_tokens = model.max_model_len - 1 if model else UINT32_MAX  # a prompt takes at least one token
    return {"max_tokens": (1, max_tokens), "max_completion_tokens": (1, max_tokens), "min_tokens": (0, max_tokens),
            "top_k": (-1, INT32_MAX), "seed": (INT64_MIN, INT64_MAX), "n": (1, max_num_choices),
            "logprobs": (0, MAX_LOGPROBS), "top_logprobs": (0, MAX_LOGPROBS),
            **{name: (0, token_id_max) for name in _TOKEN_ID_FIELDS}}


def _bound(schema: Any, kind: str, bounds: dict[str, Any]) -> None:
    """Adds `bounds` to every node of type `kind` in `schema` (through anyOf, items and map values)."""
    if isinstance(schema, dict):
        if schema.get("type") == kind:
            schema.update(bounds)
        for key in ("anyOf", "oneOf", "items", "additionalProperties"):
            _bound(schema.get(key), kind, bounds)
    elif isinstance(schema, list):
        for item in schema:
            _bound(item, kind, bounds)


def _bound_strings(properties: dict) -> None:
    if "stop" in properties:
        _bound(properties["stop"], "string", {"maxLength": MAX_STOP_STRING_CHARS})
        _bound(properties["stop"], "array", {"maxItems": MAX_STOP_STRINGS})
    if "logit_bias" in properties:
        _bound(properties["logit_bias"], "object", {"propertyNames": {"pattern": "^[0-9]+$"}})


def documented(schema: dict, max_num_choices: int, model: ModelDescription | None, api_key: bool) -> dict:
    """`schema` (FastAPI's document) with ranges, auth and error answers added; the argument is left as it was."""
    schema = copy.deepcopy(schema)
    components = schema.setdefault("components", {})
    integers = _integer_bounds(max_num_choices, model)
    for model in components.get("schemas", {}).values():
        properties = model.get("properties", {})
        for name, (low, high) in integers.items():
            if name in properties:
                _bound(properties[name], "integer", {"minimum": low, "maximum": high})
        for name, bounds in NUMBER_RANGES.items():
            if name in properties:
                _bound(properties[name], "number", bounds.json_schema())
        _bound_strings(properties)
    components.setdefault("schemas", {})["ErrorResponse"] = _ERROR_SCHEMA
    if api_key:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in schema.get("paths", {}).items():
        protected = path.startswith(("/v1/", "/tokenize", "/detokenize"))
        for operation in operations.values():
            if protected and api_key:
                operation["security"] = [{"bearer": []}]
            statuses = [400, 413, 429, 503] if "requestBody" in operation else [503] if protected else []
            statuses += [401] if protected and api_key else []
            statuses += [404] if protected else []
            for status in sorted(statuses):
                operation["responses"].setdefault(str(status), {
                    "description": _ERROR_STATUSES[status],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
    return schema


def install_openapi(app: FastAPI, max_num_choices: int, model: Callable[[], ModelDescription | None],
                    api_key: bool) -> None:
    """Serve `documented` at /openapi.json; token ids and lengths follow the served model once it is described."""

    generated = app.openapi  # FastAPI's own: built once, then cached on the app

    def openapi() -> dict:
        return documented(generated(), max_num_choices, model(), api_key)

    app.openapi = openapi
