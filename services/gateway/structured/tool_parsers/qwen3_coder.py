"""Qwen3-Coder calls, XML-ish, one function per block, each parameter's value as text:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A value is JSON when its parameter's schema is not a string and the text parses; it stays text otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pagedserve.services.gateway.api.protocol import FunctionDefinition
from pagedserve.services.gateway.structured.tool_parsers.base import CallBlock, ToolCallFormat, end_tag_at, parsed_call

CALL_START, CALL_END, FUNCTION_END = "<tool_call>", "</tool_call>", "</function>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


class Qwen3CoderFormat(ToolCallFormat):
    name = "qwen3_coder"
    triggers = (CALL_START,)

    def next_block(self, text: str, final: bool) -> CallBlock | None:
        match = _FUNCTION.match(text, len(CALL_START))
        if match is None:
            end = text.find(CALL_END)
            if end >= 0:
                return CallBlock([], end + len(CALL_END))
            return CallBlock([], len(text)) if final else None
        end = end_tag_at(text, match.end(), CALL_END, final)
        if end is None:
            return None
        call = parsed_call(match.group(1).strip(), self._arguments(match.group(1).strip(), match.group(2)))
        return CallBlock([call] if call else [], end)

    def _arguments(self, name: str, body: str) -> dict:
        properties = self.parameters(name).get("properties", {})
        return {key.strip(): _value(value, properties.get(key.strip(), {})) for key, value in _PARAMETER.findall(body)}

    def call_tag(self, function: FunctionDefinition) -> dict:
        return {"type": "tag", "begin": f"{CALL_START}\n<function={function.name}>\n",
                "content": {"type": "json_schema", "json_schema": self.parameters(function.name), "style": "qwen_xml"},
                "end": f"{FUNCTION_END}\n{CALL_END}"}

    def example(self) -> str:
        return self.format_call("<function-name>", {"<parameter-name>": "<value>"})

    def format_call(self, name: str, arguments: Any) -> str:
        parameters = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n"
                             f"</parameter>\n" for key, value in (arguments or {}).items())
        return f"{CALL_START}\n<function={name}>\n{parameters}{FUNCTION_END}\n{CALL_END}"


def _value(text: str, schema: dict) -> Any:
    if schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
