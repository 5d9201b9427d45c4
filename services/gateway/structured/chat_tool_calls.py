"""Chat answers under tools: a call's stream delta and the finish reason of an answer with calls."""

from __future__ import annotations

from pagedserve.services.gateway.structured.tool_parser import ToolCallDelta
from pagedserve.services.gateway.structured.tools import ToolPlan


def finish_reason(plan: ToolPlan, finish: str | None, num_calls: int) -> str | None:
    """An answer that ended on its own after calling tools finishes with "tool_calls" (or "stop" under a named
    tool_choice, as OpenAI answers); a cut-off answer keeps "length"."""
    return plan.finish_reason if finish == "stop" and num_calls else finish


def delta_of(call: ToolCallDelta) -> dict:
    """OpenAI's stream shape: index, id, type and name on a call's first delta, then its arguments."""
    if call.id is not None:
        return {"index": call.index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
    return {"index": call.index, "function": {"arguments": call.arguments}}
