"""Schemathesis hooks for the fault suite (SCHEMATHESIS_HOOKS=tests.faults.gateway.schemathesis_hooks).

Generations are bounded so a run fits a test suite: a generated max_tokens above MAX_TOKENS, or none, becomes
MAX_TOKENS (range checks of max_tokens itself are unit-tested; schemathesis's coverage phase, which these hooks do
not reach, runs with invalid data only)."""

from __future__ import annotations

import schemathesis

MAX_TOKENS = 4
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")


@schemathesis.hook
def map_body(ctx, body):
    if not isinstance(body, dict) or ctx.operation.path not in GENERATION_PATHS:
        return body
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if type(value) is int and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    return body
