"""A streamed chat completion's SSE turned into the Responses API's typed events.

The chat path frames each chunk as `data: {json}`; each is read back and fed to the ResponseBuilder, whose events
go out as `event: TYPE` / `data: {json}` with a `sequence_number` counting from 0. One JSON decode per chunk is the
price of reusing the whole chat path (template, tools and their parser, reasoning parser, structured outputs, stall
guard, drain) rather than keeping a second one in step with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from pagedserve.services.gateway.api.responses_output import ResponseBuilder

log = logging.getLogger(__name__)


class EventNumbering:
    def __init__(self) -> None:
        self.next = 0

    def sse(self, event: dict) -> str:
        event["sequence_number"] = self.next
        self.next += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def chat_chunks(frames: str) -> list[dict]:
    """The chunks of one or more `data:` frames ([DONE] left out)."""
    chunks = []
    for frame in frames.split("\n\n"):
        if frame.startswith("data: ") and frame != "data: [DONE]":
            chunks.append(json.loads(frame[len("data: "):]))
    return chunks


def chunk_events(builder: ResponseBuilder, chunk: dict) -> list[dict]:
    """The events of one chat chunk (its one choice's delta, or the usage chunk: the terminal event)."""
    if not chunk.get("choices"):
        return [builder.complete(chunk["usage"])] if chunk.get("usage") else []
    choice = chunk["choices"][0]
    delta = choice.get("delta") or {}
    events: list[dict] = []
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if reasoning:
        events += builder.reasoning(reasoning)
    if delta.get("content"):
        events += builder.text(delta["content"])
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("id") is not None:
            events += builder.call_start(call["index"], call["id"], function.get("name") or "")
        events += builder.call_arguments(call["index"], function.get("arguments") or "")
    if choice.get("finish_reason"):
        events += builder.finish(choice["finish_reason"])
    return events


async def response_events(chat_frames: AsyncIterator[str | bytes], builder: ResponseBuilder,
                          on_complete: Callable[[dict], Awaitable[None]]) -> AsyncIterator[str]:
    """The Responses stream of a chat stream; `on_complete(response)` runs before the terminal event is sent (a
    stored response is there for the next turn once the client sees it complete). An error event of the chat
    stream ends it with response.failed."""
    numbering = EventNumbering()
    for event in builder.start():
        yield numbering.sse(event)
    async with contextlib.aclosing(chat_frames) as frames:
        async for frame in frames:
            for chunk in chat_chunks(frame.decode() if isinstance(frame, bytes) else frame):
                if "error" in chunk:
                    yield numbering.sse(builder.fail(chunk["error"].get("message", "the response failed")))
                    return
                for event in chunk_events(builder, chunk):
                    if event["type"] in ("response.completed", "response.incomplete"):
                        await on_complete(event["response"])
                    yield numbering.sse(event)
