"""`--speculative-config`: vLLM's JSON shape, parsed and checked once at start.

Only the n-gram (prompt lookup) proposer runs today. The seam for model-based proposers (a draft model, EAGLE or
MTP heads) is documented in docs/speculative_decoding.md: they would live in the worker, next to the target model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

MAX_SPECULATIVE_TOKENS = 16  # bounds the per-position metric's label set too


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4  # draft tokens proposed per request and step at most (k)
    prompt_lookup_min: int = 2  # shortest n-gram of the context's tail matched against the earlier context
    prompt_lookup_max: int = 4  # longest; longer matches are tried first
    # no request speculates in a step while this many requests or more are running (0: never off); at high batch a
    # forward is compute-bound and rejected drafts cost what they take
    disable_by_batch_size: int = 8

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative method {self.method!r} is not supported (only 'ngram' is)")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.disable_by_batch_size < 0:
            raise ValueError("disable_by_batch_size must be >= 0")

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
            if name != "method" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"speculative config: {name} must be an integer")
        return cls(**values)
