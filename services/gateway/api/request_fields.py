"""The request fields this server does not declare in protocol.py: refused when they would change the answer,
accepted when they change nothing here, ignored with a warning when unknown.

Policy for unknown fields: vLLM's (ignore, log a warning), not OpenAI's 400. Clients and proxies (LiteLLM,
LangChain) forward provider-specific extras, and an SDK newer than the server sends fields the server has not
heard of; a 400 would break those calls for fields that mostly do not matter. The fields that do change an answer
are listed below by name and refused unless they hold their no-op value, so none of them is dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pagedserve.services.gateway.api.protocol import SamplingFields
from pagedserve.services.gateway.http.errors import OpenAIError

log = logging.getLogger(__name__)
MAX_WARNED = 256  # unknown names warned about once each, at most this many (a client cannot grow the set forever)

# accepted and ignored: they change nothing in the answer here
NO_OP_FIELDS = ("metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "request_id",
                "guided_decoding_backend", "spaces_between_special_tokens", "stream_options", "parallel_tool_calls",
                "modalities", "verbosity")

_ABSENT: Callable[[Any, SamplingFields], bool] = lambda value, body: value in (None, False)  # noqa: E731

# field -> (the values that change nothing, why the others are refused)
REFUSED_FIELDS: dict[str, tuple[Callable[[Any, SamplingFields], bool], str]] = {
    "best_of": (lambda value, body: value in (None, body.n), "best-of sampling is not supported; use n"),
    "use_beam_search": (_ABSENT, "beam search is not supported"),
    "length_penalty": (lambda value, body: value in (None, 1, 1.0), "length_penalty needs beam search"),
    "prediction": (_ABSENT, "predicted outputs are not supported"),
    "skip_special_tokens": (lambda value, body: value in (None, True), "special tokens are always skipped in text"),
    "bad_words": (lambda value, body: not value, "bad_words is not supported; use logit_bias"),
    "allowed_token_ids": (lambda value, body: not value, "allowed_token_ids is not supported; use logit_bias"),
    "logits_processors": (lambda value, body: not value, "logits processors are not supported"),
    "return_tokens_as_token_ids": (_ABSENT, "return_tokens_as_token_ids is not supported"),
    "reasoning_effort": (_ABSENT, "reasoning_effort is not supported; pass chat_template_kwargs instead"),
    "audio": (_ABSENT, "audio output is not supported"),
    "web_search_options": (_ABSENT, "web search is not supported"),
    "documents": (lambda value, body: not value, "documents are not supported"),
    "mm_processor_kwargs": (lambda value, body: not value, "this model takes text only"),
    "add_special_tokens": (lambda value, body: value is None, "add_special_tokens is not supported here"),
    "echo": (_ABSENT, "echo is a /v1/completions field"),
}

_warned: set[str] = set()


def check_extra_fields(body: SamplingFields) -> None:
    """400 naming the first undeclared field that would change the answer; a warning (once per name) for unknown
    ones."""
    for name, value in (body.model_extra or {}).items():
        refused = REFUSED_FIELDS.get(name)
        if refused is not None:
            harmless, why = refused
            if not harmless(value, body):
                raise OpenAIError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
        elif name not in NO_OP_FIELDS and name not in _warned and len(_warned) < MAX_WARNED:
            _warned.add(name)
            log.warning("ignoring the unknown request field %r (later requests with it are not reported)", name)
