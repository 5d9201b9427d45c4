"""Tools in the prompt and in the grammar: `tools`, `tool_choice`, `parallel_tool_calls`, tool turns.

Calls use the Hermes / Qwen format, one per block:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A chat template that knows tools gets them (and past calls and tool results) in its own way. A template that does
not (SmolLM2's) gets a system-prompt section listing the functions and that format, past calls as the assistant's
text in that format, and tool results as user turns wrapped in <tool_response> tags.

The grammar: `auto` leaves text free until "<tool_call>" and then forces a valid call (any named function, arguments
matching its parameters); `required` forces one or more calls and nothing else; a named function forces exactly one
call of it. `parallel_tool_calls: false` allows one call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.gateway.api.protocol import ChatCompletionRequest, ChatMessage, FunctionDefinition
from services.gateway.http.errors import OpenAIError
from services.gateway.structured.structured_outputs import Constraint, check_schema
from shared.structured_output import StructuredOutput, StructuredOutputKind

CALL_START, CALL_END = "<tool_call>", "</tool_call>"
NO_PARAMETERS = {"type": "object", "properties": {}}
MAX_WHITESPACE = 1  # JSON in a call holds at most one whitespace character in a row: no whitespace loops


@dataclass(frozen=True)
class ToolPlan:
    functions: list[FunctionDefinition]
    choice: str  # none | auto | required | named
    named: str | None  # the function a named choice forces
    parallel: bool

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish reason of an answer with calls: "stop" when one function was forced."""
        return "stop" if self.choice == "named" else "tool_calls"


def tool_plan_of(body: ChatCompletionRequest) -> ToolPlan | None:
    """None without tools; 400 for an unusable combination."""
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none"):
            raise OpenAIError(400, "tool_choice needs tools", param="tool_choice")
        return None
    functions = [tool.function for tool in body.tools]
    names = [f.name for f in functions]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate is not None:
        raise OpenAIError(400, f"two tools are named {duplicate!r}", param="tools")
    for i, function in enumerate(functions):
        check_schema(function.parameters or NO_PARAMETERS, strict=bool(function.strict),
                     param=f"tools[{i}].function.parameters")
    if isinstance(choice, str) or choice is None:
        mode, named = choice or "auto", None
    else:
        mode, named = "named", choice.function.name
        if named not in names:
            raise OpenAIError(400, f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
    return ToolPlan(functions, mode, named, body.parallel_tool_calls)


def tool_constraint(plan: ToolPlan) -> Constraint | None:
    """The structural tag that makes every call valid (None for tool_choice none)."""
    if plan.choice == "none":
        return None
    if plan.choice == "named":
        function = next(f for f in plan.functions if f.name == plan.named)
        tag_format: dict[str, Any] = _call_tag(function)
    elif plan.choice == "required":
        tag_format = {"type": "tags_with_separator", "tags": [_call_tag(f) for f in plan.functions],
                      "separator": "\n", "at_least_one": True, "stop_after_first": not plan.parallel}
    else:
        tag_format = {"type": "triggered_tags", "triggers": [CALL_START],
                      "tags": [_call_tag(f) for f in plan.functions], "stop_after_first": not plan.parallel}
    spec = json.dumps({"type": "structural_tag", "format": tag_format}, ensure_ascii=False)
    return Constraint(StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec), "tools")


def _call_tag(function: FunctionDefinition) -> dict:
    return {"type": "tag", "begin": f'{CALL_START}\n{{"name": {json.dumps(function.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": function.parameters or NO_PARAMETERS,
                        "max_whitespace_cnt": MAX_WHITESPACE},
            "end": f"}}\n{CALL_END}"}


def format_call(name: str, arguments: Any) -> str:
    """One call as the model writes it (past calls in the prompt take this form too)."""
    return f"{CALL_START}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_END}"


# --- the conversation for the chat template ------------------------------------------------------------------------

def template_messages(messages: list[ChatMessage], functions: list[FunctionDefinition] | None, native_tools: bool
                      ) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for apply_chat_template: native tool fields when the template knows tools, else text."""
    has_tool_turns = any(m.role == "tool" or m.tool_calls for m in messages)
    if not functions and not has_tool_turns:
        return [{"role": m.role, "content": m.text()} for m in messages], None
    if native_tools:
        tools = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in functions or []]
        return [_native_message(m, i) for i, m in enumerate(messages)], tools or None
    rendered = _text_messages(messages)
    return (_with_tools_section(rendered, functions) if functions else rendered), None


def _native_message(message: ChatMessage, index: int) -> dict:
    out: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.tool_calls:
        out["tool_calls"] = [{"id": call.id, "type": "function", "function": {
            "name": call.function.name, "arguments": _arguments(call.function.arguments, index, j)}}
            for j, call in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _text_messages(messages: list[ChatMessage]) -> list[dict]:
    """Past calls as the assistant's text; consecutive tool results as one user turn of <tool_response> blocks."""
    out: list[dict] = []
    for i, message in enumerate(messages):
        if message.role == "tool":
            block = f"<tool_response>\n{message.text()}\n</tool_response>"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
            continue
        content = message.text()
        if message.tool_calls:
            calls = [format_call(call.function.name, _arguments(call.function.arguments, i, j))
                     for j, call in enumerate(message.tool_calls)]
            content = "\n".join(([content] if content else []) + calls)
        out.append({"role": message.role, "content": content})
    for message in out:
        message.pop("tool_results", None)
    return out


def _arguments(text: str, message_index: int, call_index: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        param = f"messages[{message_index}].tool_calls[{call_index}].function.arguments"
        raise OpenAIError(400, f"{param} is not valid JSON", param=param) from None


def tools_section(functions: list[FunctionDefinition]) -> str:
    listed = "\n".join(json.dumps({"type": "function", "function": f.model_dump(exclude_none=True)},
                                  ensure_ascii=False) for f in functions)
    example = format_call("<function-name>", "<arguments-object>").replace('"<function-name>"', "<function-name>")
    example = example.replace('"<arguments-object>"', "<arguments-object>")
    return ("# Tools\n\nYou may call one or more functions to help with the user's request. The functions, as JSON "
            f"schemas:\n<tools>\n{listed}\n</tools>\n\nTo call a function, answer with a JSON object holding its "
            f"name and arguments inside <tool_call></tool_call> tags:\n{example}")


def _with_tools_section(messages: list[dict], functions: list[FunctionDefinition]) -> list[dict]:
    section = tools_section(functions)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{section}" if first["content"] else section},
                *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
