"""Mistral calls after the [TOOL_CALLS] token, as a JSON array (v3 tokenizers) or name[ARGS]{...} (v11 and later):

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

[TOOL_CALLS] is a special token: the text holds it only where special tokens are kept.
"""

from __future__ import annotations

import json
import re
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

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAMED = re.compile(r"\s*([A-Za-z0-9_.:-]{1,64})\[ARGS\]")
_NAME_SO_FAR = re.compile(r"[A-Za-z0-9_.:-]*(\[(A(R(G(S)?)?)?)?)?$")  # may still become name[ARGS]


class MistralFormat(ToolCallFormat):
    name = "mistral"
    triggers = (TOOL_CALLS,)

    def next_block(self, text: str, final: bool) -> CallBlock | None:
        at = skip_whitespace(text, len(TOOL_CALLS))
        named = _NAMED.match(text, len(TOOL_CALLS))
        if named is not None:
            decoded = decode_json(text, named.end())
            if decoded is None:
                return CallBlock([], len(text)) if final else None
            call = parsed_call(named.group(1), decoded[0])
            return CallBlock([call] if call else [], decoded[1])
        if not text.startswith("[", at):
            if final or (at < len(text) and not _NAME_SO_FAR.match(text, at)):
                return CallBlock([], len(text) if final else at)  # not a call after all
            return None
        decoded = decode_json(text, at)
        if decoded is None:
            return CallBlock([], len(text)) if final else None
        value, end = decoded
        items = value if isinstance(value, list) else []
        calls = [parsed_call(item.get("name"), item.get("arguments", {})) for item in items if isinstance(item, dict)]
        return CallBlock([call for call in calls if call], end)

    def call_tag(self, function: FunctionDefinition) -> dict:
        return {"type": "tag", "begin": f'{TOOL_CALLS}[{{"name": {json.dumps(function.name)}, "arguments": ',
                "content": json_schema_content(self.parameters(function.name)), "end": "}]"}

    def format_call(self, name: str, arguments: Any) -> str:
        return f"{TOOL_CALLS}{json.dumps([{'name': name, 'arguments': arguments}], ensure_ascii=False)}"
