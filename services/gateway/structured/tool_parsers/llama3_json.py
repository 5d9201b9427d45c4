"""Llama 3.1 / 3.2 JSON calls: the answer is one or more objects, `;`-separated, optionally after <|python_tag|>:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

A `{` opens calls only at the start of the answer (a JSON answer later in the text is content); the tag opens them
anywhere.
"""

from __future__ import annotations

import json
from typing import Any

from pagedserve.services.gateway.api.protocol import FunctionDefinition
from pagedserve.services.gateway.structured.tool_parsers.base import (
    CallBlock,
    ToolCallFormat,
    decode_json,
    json_schema_content,
    parsed_call,
    skip_whitespace,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolCallFormat):
    name = "llama3_json"
    triggers = (PYTHON_TAG, "{")
    only_at_start = ("{",)
    separator = "; "

    def next_block(self, text: str, final: bool) -> CallBlock | None:
        at = skip_whitespace(text, len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0)
        decoded = decode_json(text, at)
        if decoded is None:
            return CallBlock([], len(text)) if final else None
        value, end = decoded
        call = None
        if isinstance(value, dict):
            call = parsed_call(value.get("name"), value.get("parameters", value.get("arguments", {})))
        after = skip_whitespace(text, end)
        if after == len(text) and not final:  # a `;` and another call may follow
            return None
        if text.startswith(";", after):  # another call follows: the next block starts at its object
            end = skip_whitespace(text, after + 1)
            if end == len(text) and not final:
                return None
        return CallBlock([call] if call else [], end)

    def call_tag(self, function: FunctionDefinition) -> dict:
        return {"type": "tag", "begin": f'{{"name": {json.dumps(function.name)}, "parameters": ',
                "content": json_schema_content(self.parameters(function.name)), "end": "}"}

    def format_call(self, name: str, arguments: Any) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
