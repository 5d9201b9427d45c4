"""A request's output constraint from `response_format`, vLLM's `structured_outputs` or its older `guided_*` fields.

At most one may be given. Each becomes a `StructuredOutput` plus the request field it came from, so that a grammar
the engine refuses later is a 400 naming that field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.api.protocol import ResponseFormat, SamplingFields, StructuredOutputsParams
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

# JSON schema keywords the grammar engine (xgrammar 0.2) accepts but does not enforce: `strict` refuses them
UNENFORCED_KEYWORDS = ("not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains",
                       "dependentRequired", "dependentSchemas", "dependencies")
ENFORCED_FORMATS = ("email", "date", "time", "date-time", "duration", "uri", "uri-reference", "uri-template",
                    "uuid", "ipv4", "ipv6", "hostname", "json-pointer", "relative-json-pointer")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems")


@dataclass(frozen=True)
class Constraint:
    structured: StructuredOutput
    param: str  # the request field it came from (400s name it)


def constraint_of(body: SamplingFields) -> Constraint | None:
    """The request's one constraint, or None; 400 when several are given or one is malformed."""
    found: list[Constraint] = []
    if body.response_format is not None and body.response_format.type != "text":
        found.append(_from_response_format(body.response_format))
    if body.structured_outputs is not None:
        found.extend(_from_structured_outputs(body.structured_outputs))
    legacy = {"guided_json": body.guided_json, "guided_regex": body.guided_regex,
              "guided_choice": body.guided_choice, "guided_grammar": body.guided_grammar}
    found.extend(_from_field(name, name.removeprefix("guided_"), value, any_whitespace=False)
                 for name, value in legacy.items() if value is not None)
    if len(found) > 1:
        raise OpenAIError(400, f"give one output constraint, not both {found[0].param} and {found[1].param}",
                          param=found[1].param)
    return found[0] if found else None


def _from_response_format(rf: ResponseFormat) -> Constraint:
    if rf.type == "json_object":
        return Constraint(StructuredOutput(StructuredOutputKind.JSON_OBJECT, ""), "response_format")
    if rf.type == "structural_tag":
        if rf.format is None:
            raise OpenAIError(400, "response_format of type structural_tag needs a format", param="response_format")
        spec = _json_text({"type": "structural_tag", "format": rf.format})
        return Constraint(StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec), "response_format")
    param = "response_format.json_schema"
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise OpenAIError(400, "response_format of type json_schema needs json_schema.schema", param=param)
    schema = rf.json_schema.schema_
    check_schema(schema, strict=bool(rf.json_schema.strict), param=f"{param}.schema")
    return Constraint(StructuredOutput(StructuredOutputKind.JSON_SCHEMA, _json_text(schema)), param)


def _from_structured_outputs(so: StructuredOutputsParams) -> list[Constraint]:
    any_whitespace = so.disable_any_whitespace is False
    values = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar,
              "structural_tag": so.structural_tag, "json_object": so.json_object or None}
    return [_from_field(f"structured_outputs.{name}", name, value, any_whitespace)
            for name, value in values.items() if value is not None]


def _from_field(param: str, name: str, value: Any, any_whitespace: bool) -> Constraint:
    kinds = StructuredOutputKind
    if name == "json":
        schema = _parsed_json(value, param)
        check_schema(schema, strict=False, param=param)
        return Constraint(StructuredOutput(kinds.JSON_SCHEMA, _json_text(schema), any_whitespace), param)
    if name == "json_object":
        return Constraint(StructuredOutput(kinds.JSON_OBJECT, "", any_whitespace), param)
    if name == "regex":
        return Constraint(StructuredOutput(kinds.REGEX, value), param)
    if name == "choice":
        return Constraint(StructuredOutput(kinds.GRAMMAR, choice_grammar(value, param)), param)
    if name == "grammar":
        return Constraint(StructuredOutput(kinds.GRAMMAR, value), param)
    tag = _parsed_json(value, param)
    if not isinstance(tag, dict):
        raise OpenAIError(400, f"{param} must be a structural tag object", param=param)
    return Constraint(StructuredOutput(kinds.STRUCTURAL_TAG, _json_text(tag), any_whitespace), param)


def choice_grammar(choices: list[str], param: str) -> str:
    """An EBNF grammar whose only sentences are the choices (JSON string escapes are EBNF's)."""
    if not choices:
        raise OpenAIError(400, f"{param} must list at least one choice", param=param)
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def check_schema(schema: Any, strict: bool, param: str) -> None:
    """A JSON schema must be an object (or a boolean); under strict every keyword must be enforceable."""
    if not isinstance(schema, dict | bool):
        raise OpenAIError(400, f"{param} must be a JSON schema object", param=param)
    if strict:
        problem = unenforced_keyword(schema)
        if problem is not None:
            raise OpenAIError(400, f"{param} uses {problem}, which the grammar engine cannot enforce; drop it or "
                                   f"send strict: false to have it ignored", param=param)


def unenforced_keyword(schema: Any, path: str = "#") -> str | None:
    """The first place (a JSON pointer with its keyword) the grammar engine would not enforce, or None."""
    if not isinstance(schema, dict):
        return None
    for keyword in UNENFORCED_KEYWORDS:
        if keyword in schema:
            return f"'{keyword}' at {path}"
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) > 1:
        return f"'allOf' with several schemas at {path}"
    if "format" in schema and schema["format"] not in ENFORCED_FORMATS:
        return f"format '{schema['format']}' at {path}"
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return f"the remote $ref '{ref}' at {path}"
    children = [(f"{path}/{key}", schema.get(key)) for key in _SUBSCHEMAS]
    children += [(f"{path}/{key}/{i}", sub) for key in _SUBSCHEMA_LISTS
                 for i, sub in enumerate(schema.get(key) or []) if isinstance(schema.get(key), list)]
    children += [(f"{path}/{key}/{name}", sub) for key in _SUBSCHEMA_MAPS
                 for name, sub in (schema.get(key) or {}).items() if isinstance(schema.get(key), dict)]
    for child_path, child in children:
        found = unenforced_keyword(child, child_path)
        if found is not None:
            return found
    return None


def _parsed_json(value: Any, param: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise OpenAIError(400, f"{param} is not valid JSON: {exc}", param=param) from None


def _json_text(value: Any) -> str:
    """JSON text in the client's key order (property order decides the order of generation)."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
