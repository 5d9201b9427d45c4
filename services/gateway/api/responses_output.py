"""A Response object built from a chat answer's pieces, with the typed stream events that build it.

One builder serves both forms: a whole answer is fed as one piece of each kind, a stream piece by piece, so the
final Response of a stream equals what its deltas add up to. At most one output item is open at a time; a piece of
another kind closes it (reasoning, then message text, then function calls, in the order the chat answer gives them).
Events are dicts without `sequence_number` (the stream numbers them as it sends them).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ResponseHead:
    """The request's fields a Response echoes."""

    id: str
    model: str
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict] = field(default_factory=list)  # in the Responses shape
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text_format: dict | None = None
    metadata: dict | None = None
    store: bool = True
    created_at: int = field(default_factory=lambda: int(time.time()))


@dataclass
class _OpenItem:
    output_index: int
    item: dict
    call_index: int | None = None  # a function call's index in the chat answer


class ResponseBuilder:
    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.output: list[dict] = []
        self.status = "in_progress"
        self.usage: dict | None = None
        self.incomplete_details: dict | None = None
        self.error: dict | None = None
        self._open: _OpenItem | None = None

    def response(self) -> dict:
        h = self.head
        return {"id": h.id, "object": "response", "created_at": h.created_at, "status": self.status,
                "model": h.model, "output": [dict(item) for item in self.output], "usage": self.usage,
                "incomplete_details": self.incomplete_details, "error": self.error, "instructions": h.instructions,
                "previous_response_id": h.previous_response_id, "tools": h.tools, "tool_choice": h.tool_choice,
                "parallel_tool_calls": h.parallel_tool_calls, "temperature": h.temperature, "top_p": h.top_p,
                "max_output_tokens": h.max_output_tokens, "text": {"format": h.text_format or {"type": "text"}},
                "metadata": h.metadata or {}, "store": h.store, "truncation": "disabled", "background": False,
                "reasoning": None, "user": None}

    def start(self) -> list[dict]:
        return [{"type": "response.created", "response": self.response()},
                {"type": "response.in_progress", "response": self.response()}]

    def reasoning(self, text: str) -> list[dict]:
        events = self._open_item("reasoning", lambda: {"type": "reasoning", "id": new_id("rs"), "summary": [],
                                                       "content": [{"type": "reasoning_text", "text": ""}],
                                                       "status": "in_progress"})
        item = self._open.item
        item["content"][0]["text"] += text
        return events + [{"type": "response.reasoning_text.delta", "item_id": item["id"],
                          "output_index": self._open.output_index, "content_index": 0, "delta": text}]

    def text(self, text: str) -> list[dict]:
        events = self._open_item("message", lambda: {"type": "message", "id": new_id("msg"), "role": "assistant",
                                                     "status": "in_progress", "content": []})
        item, index = self._open.item, self._open.output_index
        if not item["content"]:
            item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "part": dict(item["content"][0])})
        item["content"][0]["text"] += text
        return events + [{"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                          "content_index": 0, "delta": text, "logprobs": []}]

    def call_start(self, call_index: int, call_id: str, name: str) -> list[dict]:
        events = self._close()
        item = {"type": "function_call", "id": new_id("fc"), "call_id": call_id, "name": name, "arguments": "",
                "status": "in_progress"}
        self._open = _OpenItem(len(self.output), item, call_index)
        self.output.append(item)
        return events + [{"type": "response.output_item.added", "output_index": self._open.output_index,
                          "item": dict(item)}]

    def call_arguments(self, call_index: int, piece: str) -> list[dict]:
        if not piece or self._open is None or self._open.call_index != call_index:
            return []
        self._open.item["arguments"] += piece
        return [{"type": "response.function_call_arguments.delta", "item_id": self._open.item["id"],
                 "output_index": self._open.output_index, "delta": piece}]

    def finish(self, finish_reason: str | None) -> list[dict]:
        """Close the open item; a `length` finish makes the response (and its open item) incomplete."""
        if finish_reason == "length":
            self.incomplete_details = {"reason": "max_output_tokens"}
        return self._close()

    def complete(self, usage: dict) -> dict:
        """The terminal event: response.completed, or response.incomplete when cut by max_output_tokens."""
        self.usage = responses_usage(usage)
        self.status = "incomplete" if self.incomplete_details else "completed"
        return {"type": f"response.{self.status}", "response": self.response()}

    def fail(self, message: str) -> dict:
        self._close()
        self.status, self.error = "failed", {"code": "server_error", "message": message}
        return {"type": "response.failed", "response": self.response()}

    def _open_item(self, kind: str, new_item) -> list[dict]:
        if self._open is not None and self._open.item["type"] == kind:
            return []
        events = self._close()
        item = new_item()
        self._open = _OpenItem(len(self.output), item)
        self.output.append(item)
        return events + [{"type": "response.output_item.added", "output_index": self._open.output_index,
                          "item": {**item, "content": []} if kind == "message" else dict(item)}]

    def _close(self) -> list[dict]:
        if self._open is None:
            return []
        item, index = self._open.item, self._open.output_index
        self._open = None
        item["status"] = "incomplete" if self.incomplete_details else "completed"
        events: list[dict] = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [{"type": "response.output_text.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "text": part["text"], "logprobs": []},
                       {"type": "response.content_part.done", "item_id": item["id"], "output_index": index,
                        "content_index": 0, "part": dict(part)}]
        elif item["type"] == "reasoning":
            events.append({"type": "response.reasoning_text.done", "item_id": item["id"], "output_index": index,
                           "content_index": 0, "text": item["content"][0]["text"]})
        else:
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": index, "name": item["name"], "arguments": item["arguments"]})
        return events + [{"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]


def _copy(item: dict) -> dict:
    return {**item, "content": [dict(part) for part in item["content"]]} if "content" in item else dict(item)


def responses_usage(chat_usage: dict) -> dict:
    """Chat usage in the Responses shape (reasoning tokens when the chat path counts them)."""
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": chat_usage["total_tokens"]}


def build_whole(builder: ResponseBuilder, completion: dict) -> dict:
    """The Response of a whole chat completion (its one choice)."""
    choice = completion["choices"][0]
    message = choice["message"]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        builder.reasoning(reasoning)
    if message.get("content"):
        builder.text(message["content"])
    for i, call in enumerate(message.get("tool_calls") or []):
        builder.call_start(i, call["id"], call["function"]["name"])
        builder.call_arguments(i, call["function"]["arguments"])
    builder.finish(choice["finish_reason"])
    builder.complete(completion["usage"])
    return builder.response()
