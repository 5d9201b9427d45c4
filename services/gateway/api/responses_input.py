"""A Responses API request as the chat completion that answers it: input items as chat messages, function tools,
tool_choice and text.format as their chat fields. Everything this server cannot do is a 400 naming it."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pagedserve.services.gateway.api.protocol import ChatCompletionRequest, FunctionDefinition
from pagedserve.services.gateway.api.responses_protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ResponsesRequest,
)
from pagedserve.services.gateway.http.errors import OpenAIError

SAMPLING_EXTRAS = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "chat_template_kwargs")


def input_items(body: ResponsesRequest) -> list[InputItem]:
    """The request's own input as items (a string is one user message)."""
    if isinstance(body.input, str):
        return [MessageItem(role="user", content=body.input)]
    return list(body.input)


def chat_messages(instructions: str | None, items: list[InputItem]) -> list[dict]:
    """Chat messages: instructions as the system message, consecutive function calls as one assistant turn with
    tool_calls, call outputs as tool turns; reasoning items are left out."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            _check_arguments(item.arguments, f"input[{i}].arguments")
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    if not any(m["role"] != "system" for m in messages):
        raise OpenAIError(400, "input must hold at least one message or function call output", param="input")
    return messages


def _check_arguments(text: str, param: str) -> None:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        raise OpenAIError(400, f"{param} is not valid JSON", param=param) from None


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict] | None:
    """Function tools in the chat shape; any other tool type is a 400 naming it."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise OpenAIError(400, f"tools[{i}] is a {kind!r} tool: this server runs no built-in tools (web search, "
                                   "file search, code interpreter, computer use, MCP, ...); only function tools are "
                                   "supported", param=f"tools[{i}].type")
        fields = {k: v for k, v in tool.items() if k in ("name", "description", "parameters", "strict")}
        try:
            function = FunctionDefinition.model_validate(fields)
        except ValidationError as exc:
            raise OpenAIError(400, f"tools[{i}] is not a valid function tool: {exc.errors()[0]['msg']}",
                              param=f"tools[{i}]") from None
        out.append({"type": "function", "function": function.model_dump(exclude_none=True)})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise OpenAIError(400, f"tool_choice of type {choice.get('type')!r} is not supported: use none, auto, required "
                           "or {\"type\": \"function\", \"name\": ...}", param="tool_choice")


def response_format(body: ResponsesRequest) -> dict | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None:
        raise OpenAIError(400, "text.format of type json_schema needs a schema", param="text.format.schema")
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


def chat_request(body: ResponsesRequest, history: list[InputItem]) -> ChatCompletionRequest:
    """The chat completion answering `body` after the stored conversation `history` (input and output items)."""
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise OpenAIError(400, f"max_output_tokens must be at least 1, got {body.max_output_tokens}",
                          param="max_output_tokens")
    fields: dict[str, Any] = {
        "model": body.model, "messages": chat_messages(body.instructions, history + input_items(body)),
        "tools": chat_tools(body.tools), "tool_choice": chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls is not False, "max_completion_tokens": body.max_output_tokens,
        "response_format": response_format(body), "stream": bool(body.stream),
        "stream_options": {"include_usage": True} if body.stream else None,
        **{name: getattr(body, name) for name in SAMPLING_EXTRAS}}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        raise OpenAIError(400, f"{'.'.join(map(str, error['loc']))}: {error['msg']}", param="input") from None


_CHAT_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
                "response_format.json_schema": "text.format",
                "response_format.json_schema.schema": "text.format.schema"}


def responses_param(param: str | None) -> str | None:
    """A chat error's field under its Responses API name (tools[i].function.x is tools[i].x here)."""
    if param is None or param in _CHAT_PARAMS:
        return _CHAT_PARAMS.get(param, param) if param else None
    if param.startswith("tools["):
        return param.replace(".function", "", 1)
    return "input" if param.startswith("messages") else param
