"""Request fields -> one output constraint, with 400s naming the field."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest, CompletionRequest
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.structured_outputs import constraint_of, unenforced_keyword
from pagedserve.shared.structured_output import StructuredOutputKind as Kind

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}, "required": ["b"]}


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields})


def error_of(**fields) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        constraint_of(chat(**fields))
    assert info.value.status == 400
    return info.value


def test_each_field_gives_its_kind_and_param():
    cases = [
        ({"response_format": {"type": "json_object"}}, Kind.JSON_OBJECT, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
         Kind.JSON_SCHEMA, "response_format.json_schema"),
        ({"structured_outputs": {"json": SCHEMA}}, Kind.JSON_SCHEMA, "structured_outputs.json"),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, Kind.JSON_SCHEMA, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "[0-9]+"}}, Kind.REGEX, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, Kind.GRAMMAR, "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, Kind.GRAMMAR, "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": True}}, Kind.JSON_OBJECT, "structured_outputs.json_object"),
        ({"guided_json": SCHEMA}, Kind.JSON_SCHEMA, "guided_json"),
        ({"guided_regex": "a+"}, Kind.REGEX, "guided_regex"),
        ({"guided_choice": ["x"]}, Kind.GRAMMAR, "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, Kind.GRAMMAR, "guided_grammar"),
    ]
    for fields, kind, param in cases:
        constraint = constraint_of(chat(**fields))
        assert (constraint.structured.kind, constraint.param) == (kind, param), fields
    assert constraint_of(chat()) is None and constraint_of(chat(response_format={"type": "text"})) is None
    assert constraint_of(CompletionRequest(prompt="x", guided_regex="a+")).param == "guided_regex"


def test_schema_text_keeps_the_property_order_and_whitespace_is_compact_by_default():
    constraint = constraint_of(chat(structured_outputs={"json": SCHEMA}))
    assert list(json.loads(constraint.structured.spec)["properties"]) == ["b", "a"]
    assert not constraint.structured.any_whitespace
    loose = constraint_of(chat(structured_outputs={"json": SCHEMA, "disable_any_whitespace": False}))
    assert loose.structured.any_whitespace and loose.structured.key != constraint.structured.key


def test_choice_grammar_escapes_the_choices():
    constraint = constraint_of(chat(structured_outputs={"choice": ['say "hi"', "a\\b"]}))
    assert constraint.structured.spec == 'root ::= "say \\"hi\\"" | "a\\\\b"'


def test_malformed_constraints_are_400s_naming_their_field():
    assert error_of(response_format={"type": "json_object"}, guided_regex="a").param == "guided_regex"
    assert error_of(structured_outputs={"regex": "a", "choice": ["b"]}).param == "structured_outputs.choice"
    assert error_of(structured_outputs={"choice": []}).param == "structured_outputs.choice"
    assert error_of(structured_outputs={"json": "{not json"}).param == "structured_outputs.json"
    assert error_of(structured_outputs={"json": "[1, 2]"}).param == "structured_outputs.json"
    assert error_of(response_format={"type": "json_schema"}).param == "response_format.json_schema"
    assert error_of(response_format={"type": "structural_tag"}).param == "response_format"


def test_strict_refuses_what_the_engine_would_ignore():
    unenforced = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    error = error_of(response_format={"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": unenforced, "strict": True}})
    assert error.param == "response_format.json_schema.schema" and "uniqueItems" in error.message
    loose = constraint_of(chat(response_format={"type": "json_schema",
                                                "json_schema": {"name": "x", "schema": unenforced}}))
    assert loose.structured.kind is Kind.JSON_SCHEMA  # without strict: accepted, uniqueItems not enforced


def test_unenforced_keywords_are_found_anywhere():
    assert unenforced_keyword(SCHEMA) is None
    assert unenforced_keyword({"$defs": {"A": {"not": {}}}}) == "'not' at #/$defs/A"
    assert unenforced_keyword({"anyOf": [{"type": "string", "format": "color"}]}) == "format 'color' at #/anyOf/0"
    assert unenforced_keyword({"allOf": [{"type": "string"}]}) is None
    assert unenforced_keyword({"allOf": [{"type": "string"}, {"maxLength": 3}]}).startswith("'allOf' with several")
    assert unenforced_keyword({"items": {"$ref": "https://example.com/s.json"}}).startswith("the remote $ref")
    assert unenforced_keyword({"type": "string", "format": "email"}) is None
