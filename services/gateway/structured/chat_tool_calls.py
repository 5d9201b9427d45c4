"""Chat answers under tools: tool_calls in the message or in stream deltas, and their finish reason."""

from __future__ import annotations

from services.gateway.api.generation import ChoiceResult
from services.gateway.structured.tool_parser import ToolCallDelta, ToolCallParser, parse_tool_calls
from services.gateway.structured.tools import ToolPlan


def finish_reason(plan: ToolPlan, finish: str | None, num_calls: int) -> str | None:
    """An answer that ended on its own after calling tools finishes with "tool_calls" (or "stop" under a named
    tool_choice, as OpenAI answers); a cut-off answer keeps "length"."""
    return plan.finish_reason if finish == "stop" and num_calls else finish


def message_of(plan: ToolPlan, result: ChoiceResult) -> tuple[dict, str | None]:
    """(the assistant message, the finish reason) of a whole answer."""
    content, calls = parse_tool_calls(result.text, plan.format, plan.forced)
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [call.to_openai() for call in calls]
    return message, finish_reason(plan, result.finish_reason, len(calls))


def delta_of(call: ToolCallDelta) -> dict:
    """OpenAI's stream shape: index, id, type and name on a call's first delta, then argument pieces."""
    if call.id is not None:
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, "function": {"arguments": call.arguments}}


class StreamedToolCalls:
    """The deltas (OpenAI `delta` objects plus the finish reason) of each choice of a streamed answer."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self._parsers: dict[int, ToolCallParser] = {}

    def deltas(self, index: int, text: str, finish: str | None) -> list[tuple[dict, str | None]]:
        parser = self._parsers.setdefault(index, ToolCallParser(self.plan.format, self.plan.forced))
        content, calls = parser.feed(text, final=finish is not None)
        out: list[tuple[dict, str | None]] = [({"content": content}, None)] if content else []
        out += [({"tool_calls": [delta_of(call)]}, None) for call in calls]
        if finish is not None:
            out.append(({}, finish_reason(self.plan, finish, len(parser.calls))))
        return out
