"""Tools in the prompt and in the grammar: `tools`, `tool_choice`, `parallel_tool_calls`, tool turns.

Calls use the format of the model's family (`--tool-call-parser`, tool_parsers/), Hermes / Qwen by default:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A chat template that knows tools gets them (and past calls and tool results) in its own way. A template that does
not (SmolLM2's) gets a system-prompt section listing the functions and that format, past calls as the assistant's
text in that format, and tool results as user turns wrapped in <tool_response> tags.

The grammar: `auto` leaves text free until a call opens (the format's trigger) and then forces a valid call (any
named function, arguments matching its parameters); `required` forces one or more calls and nothing else; a named
function forces exactly one call of it. `parallel_tool_calls: false` allows one call. After the last call up to
MAX_TRAILING_WHITESPACE whitespace characters may come before the end: a model that writes newlines after a call is
not forced into another call (SmolLM2 writes two: with one allowed, its second newline was masked and greedy
decoding opened a second, duplicate call). The bound ends the answer of a model that would write on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest, ChatMessage, FunctionDefinition
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.structured_outputs import Constraint, check_schema
from pagedserve.services.gateway.structured.tool_parsers import TOOL_CALL_FORMATS
from pagedserve.services.gateway.structured.tool_parsers.base import NO_PARAMETERS, ToolCallFormat
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

MAX_TRAILING_WHITESPACE = 4
# After the last call, before the end. ASCII only: `\s` would let a model that wants to write text on pad with
# Unicode spaces, token by byte token.
TRAILING_WHITESPACE = {"type": "regex", "pattern": f"[ \\t\\r\\n]{{0,{MAX_TRAILING_WHITESPACE}}}"}


@dataclass(frozen=True)
class ToolPlan:
    functions: list[FunctionDefinition]
    choice: str  # none | auto | required | named
    named: str | None  # the function a named choice forces
    parallel: bool
    format: ToolCallFormat

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    @property
    def forced(self) -> bool:
        """The grammar allows calls only: any text of the answer is a call's."""
        return self.choice in ("required", "named")

    @property
    def finish_reason(self) -> str:
        """OpenAI's finish reason of an answer with calls: "stop" when one function was forced."""
        return "stop" if self.choice == "named" else "tool_calls"


def tool_plan_of(body: ChatCompletionRequest, parser: str = "hermes") -> ToolPlan | None:
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
    return ToolPlan(functions, mode, named, body.parallel_tool_calls, TOOL_CALL_FORMATS[parser](functions))


def tool_constraint(plan: ToolPlan) -> Constraint | None:
    """The structural tag that makes every call valid (None for tool_choice none)."""
    if plan.choice == "none":
        return None
    tags = [plan.format.call_tag(f) for f in plan.functions]
    if plan.choice == "named":
        function = next(f for f in plan.functions if f.name == plan.named)
        tag_format: dict[str, Any] = {"type": "sequence", "elements": [plan.format.call_tag(function),
                                                                         TRAILING_WHITESPACE]}
    elif plan.choice == "required":
        calls = {"type": "tags_with_separator", "tags": tags, "separator": plan.format.separator,
                 "at_least_one": True, "stop_after_first": not plan.parallel}
        tag_format = {"type": "sequence", "elements": [calls, TRAILING_WHITESPACE]}
    else:
        triggers = sorted({_trigger_of(tag["begin"], plan.format) for tag in tags})
        tag_format = {"type": "triggered_tags", "triggers": triggers, "tags": tags,
                      "stop_after_first": not plan.parallel}
    spec = json.dumps({"type": "structural_tag", "format": tag_format}, ensure_ascii=False)
    return Constraint(StructuredOutput(StructuredOutputKind.STRUCTURAL_TAG, spec), "tools")


def _trigger_of(begin: str, call_format: ToolCallFormat) -> str:
    """The text that opens a call's tag in auto mode: the format's trigger it begins with (`{"name": ` for a bare
    JSON format, so that plain braces in the text stay free)."""
    trigger = next(t for t in call_format.triggers if begin.startswith(t))
    return '{"name": ' if trigger == "{" else trigger


# --- the conversation for the chat template ------------------------------------------------------------------------

def template_messages(messages: list[ChatMessage], functions: list[FunctionDefinition] | None, native_tools: bool,
                      call_format: ToolCallFormat | None = None) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for apply_chat_template: native tool fields when the template knows tools, else text."""
    has_tool_turns = any(m.role == "tool" or m.tool_calls for m in messages)
    if not functions and not has_tool_turns:
        return [{"role": m.role, "content": m.text()} for m in messages], None
    if native_tools:
        tools = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in functions or []]
        return [_native_message(m, i) for i, m in enumerate(messages)], tools or None
    call_format = call_format or TOOL_CALL_FORMATS["hermes"](functions or [])
    rendered = _text_messages(messages, call_format)
    return (_with_tools_section(rendered, functions, call_format) if functions else rendered), None


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


def _text_messages(messages: list[ChatMessage], call_format: ToolCallFormat) -> list[dict]:
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
            calls = [call_format.format_call(call.function.name, _arguments(call.function.arguments, i, j))
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


def tools_section(functions: list[FunctionDefinition], call_format: ToolCallFormat) -> str:
    listed = "\n".join(json.dumps({"type": "function", "function": f.model_dump(exclude_none=True)},
                                  ensure_ascii=False) for f in functions)
    return ("# Tools\n\nYou may call one or more functions to help with the user's request. The functions, as JSON "
            f"schemas:\n<tools>\n{listed}\n</tools>\n\nTo call a function, {call_format.instruction}:\n"
            f"{call_format.example()}")


def _with_tools_section(messages: list[dict], functions: list[FunctionDefinition], call_format: ToolCallFormat
                        ) -> list[dict]:
    section = tools_section(functions, call_format)
    if messages and messages[0]["role"] in ("system", "developer"):
        first = messages[0]
        return [{**first, "content": f"{first['content']}\n\n{section}" if first["content"] else section},
                *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
