"""A constraint that applies to the answer only, after a thinking model's reasoning: one structural tag that admits
a free think block (`<think>` any text `</think>`; the opening tag left out where the prompt already opened it)
and then the constrained answer. xgrammar composes the parts (`sequence`), so JSON schemas, regexes, EBNF grammars
and tool-call tags keep their own meaning after the reasoning. Lark grammars cannot be composed: a 400."""

from __future__ import annotations

import json
from dataclasses import replace

from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.reasoning_parsers import ReasoningFormat
from pagedserve.services.gateway.structured.structured_outputs import Constraint
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

BETWEEN = {"type": "regex", "pattern": "\\s{0,2}"}  # the newlines models write after </think>


def after_reasoning(constraint: Constraint | None, reasoning: type[ReasoningFormat] | None) -> Constraint | None:
    """The constraint with a free reasoning block in front; unchanged without reasoning."""
    if constraint is None or reasoning is None:
        return constraint
    think = ({"type": "tag", "begin": "", "content": {"type": "any_text"}, "end": reasoning.end}
             if reasoning.starts_in_reasoning else
             {"type": "tag", "begin": reasoning.start, "content": {"type": "any_text"}, "end": reasoning.end})
    answer = _answer_format(constraint)
    spec = json.dumps({"type": "structural_tag", "format": {"type": "sequence", "elements": [think, BETWEEN, answer]}},
                      ensure_ascii=False)
    return replace(constraint, structured=StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec,
                                                           constraint.structured.any_whitespace))


def _answer_format(constraint: Constraint) -> dict:
    structured = constraint.structured
    kind, spec = structured.kind, structured.spec
    if kind is StructuredOutputKind.STRUCTURAL_TAG:
        return json.loads(spec)["format"]
    if kind is StructuredOutputKind.JSON_SCHEMA:
        return {"type": "json_schema", "json_schema": json.loads(spec)}
    if kind is StructuredOutputKind.JSON_OBJECT:
        return {"type": "json_schema", "json_schema": {"type": "object"}}
    if kind is StructuredOutputKind.REGEX:
        return {"type": "regex", "pattern": spec}
    if kind is StructuredOutputKind.GRAMMAR:
        return {"type": "grammar", "grammar": spec}
    raise OpenAIError(400, f"{constraint.param}: a {kind.value} grammar cannot follow a thinking model's reasoning; "
                           "use EBNF, or turn thinking off (chat_template_kwargs enable_thinking false)",
                      param=constraint.param)
