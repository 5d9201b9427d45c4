"""Hermes / Qwen 2.5 calls, one JSON object per block:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

import json
from typing import Any

from pagedserve.services.gateway.api.protocol import FunctionDefinition
from pagedserve.services.gateway.structured.tool_parsers.base import (
    CallBlock,
    ToolCallFormat,
    decode_json,
    end_tag_at,
    json_schema_content,
    parsed_call,
    skip_whitespace,
)

CALL_START, CALL_END = "<tool_call>", "</tool_call>"


class HermesFormat(ToolCallFormat):
    name = "hermes"
    triggers = (CALL_START,)
    instruction = "answer with a JSON object holding its name and arguments inside <tool_call></tool_call> tags"

    def next_block(self, text: str, final: bool) -> CallBlock | None:
        at = skip_whitespace(text, len(CALL_START))
        decoded = decode_json(text, at)
        if decoded is None:
            end = text.find(CALL_END)
            if end >= 0:
                return CallBlock([], end + len(CALL_END))
            return CallBlock([], len(text)) if final else None
        value, at = decoded
        end = end_tag_at(text, at, CALL_END, final)
        if end is None:
            return None
        call = None
        if isinstance(value, dict):
            call = parsed_call(value.get("name"), value.get("arguments", value.get("parameters", {})))
        return CallBlock([call] if call else [], end)

    def call_tag(self, function: FunctionDefinition) -> dict:
        return {"type": "tag", "begin": f'{CALL_START}\n{{"name": {json.dumps(function.name)}, "arguments": ',
                "content": json_schema_content(self.parameters(function.name)), "end": f"}}\n{CALL_END}"}

    def format_call(self, name: str, arguments: Any) -> str:
        return f"{CALL_START}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_END}"
