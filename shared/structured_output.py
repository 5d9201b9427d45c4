"""A request's output constraint: what the grammar engine compiles, shared by the gateway, scheduler and worker.

The gateway turns `response_format`, vLLM's `structured_outputs` and `tools` into one `StructuredOutput`; the
worker compiles it (cached by `key`) and masks the logits of every step with it.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass


class StructuredOutputKind(enum.Enum):
    JSON_SCHEMA = "json_schema"  # spec: a JSON schema (JSON text)
    JSON_OBJECT = "json_object"  # spec: empty; any JSON object
    REGEX = "regex"  # spec: a regular expression the whole output matches
    GRAMMAR = "grammar"  # spec: an EBNF grammar (xgrammar's / GBNF dialect) with a `root` rule
    LARK = "lark"  # spec: a Lark grammar with a `start` rule
    STRUCTURAL_TAG = "structural_tag"  # spec: an xgrammar structural tag (JSON text); tool calls use it


@dataclass(frozen=True)
class StructuredOutput:
    kind: StructuredOutputKind
    spec: str
    any_whitespace: bool = False  # JSON may hold free whitespace between tokens (off: one space after , and :)

    @property
    def key(self) -> str:
        """Equal keys compile to the same grammar: the cache key of compiled grammars."""
        text = f"{self.kind.value}\0{int(self.any_whitespace)}\0{self.spec}"
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
