"""`--speculative-config`: vLLM's JSON shape, parsed and checked once at start by every service that reads it.

Two proposers: "ngram" (prompt lookup; the scheduler proposes, it holds every request's tokens) and "draft_model"
(a smaller model of the same vocabulary that the worker runs beside the target over its own paged KV; the
scheduler only reserves the draft positions). `pagedserve serve` hands the one flag to both the scheduler and the
worker; the scheduler uses the method, k and the batch limit, the worker the draft model's folder.
docs/speculative_decoding.md has the design and the seam EAGLE / MTP heads would use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

MAX_SPECULATIVE_TOKENS = 16  # bounds the per-position metric's label set too
METHODS = ("ngram", "draft_model")
_STRING_KEYS = ("method", "model")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"  # "ngram" or "draft_model" (the default when only "model" is given, as in vLLM)
    model: str = ""  # draft_model: the draft model's folder (same tokenizer and vocabulary as the target)
    num_speculative_tokens: int = 4  # draft tokens proposed per request and step at most (k)
    prompt_lookup_min: int = 2  # ngram: shortest n-gram of the context's tail matched against the earlier context
    prompt_lookup_max: int = 4  # ngram: longest; longer matches are tried first
    # no request speculates in a step while this many requests or more are running or waiting (0: never off); at
    # high batch a forward is compute-bound and rejected drafts cost what they take
    disable_by_batch_size: int = 8

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method {self.method!r} is not supported (only {', '.join(METHODS)})")
        if self.method == "draft_model" and not self.model:
            raise ValueError('speculative method "draft_model" needs "model": the draft model\'s folder')
        if self.method != "draft_model" and self.model:
            raise ValueError(f'speculative config: "model" is for method "draft_model", not {self.method!r}')
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.disable_by_batch_size < 0:
            raise ValueError("disable_by_batch_size must be >= 0")

    @property
    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig | None:
        """None for an empty string (speculation off); ValueError naming the problem otherwise."""
        if not text.strip():
            return None
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("speculative config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"speculative config: unknown keys {unknown} (known: {sorted(known)})")
        for name, value in values.items():
            if name in _STRING_KEYS:
                if not isinstance(value, str):
                    raise ValueError(f"speculative config: {name} must be a string")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"speculative config: {name} must be an integer")
        if "model" in values and "method" not in values:
            values["method"] = "draft_model"
        return cls(**values)
