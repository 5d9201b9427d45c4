"""Tool calls out of the model's text, as it streams: <tool_call>{"name": ..., "arguments": {...}}</tool_call>.

Deltas follow OpenAI's stream: a call's first delta has its index, id and name with empty arguments, the next ones
pieces of the arguments text (as the model wrote it). Text outside the blocks is content; whitespace next to a
block is not. A non-streamed answer is parsed by the same code fed the whole text, so streamed deltas always
reassemble to the non-streamed result.

    content | <tool_call> | {"name": "f", "arguments": | {"x": 1} | } | </tool_call> | content
              start tag      header (name)                 arguments  the object's end   end tag
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from services.gateway.structured.tools import CALL_END, CALL_START

_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S|$)')
_ARGUMENTS_TAIL = re.compile(r"\s*\}?\s*$")  # may still turn out to close the call's object


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCallDelta:
    index: int  # the call's index in the answer
    arguments: str
    id: str | None = None  # on the call's first delta
    name: str | None = None  # on the call's first delta


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str = ""

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class ToolCallParser:
    def __init__(self) -> None:
        self.calls: list[ParsedCall] = []
        self.content = ""  # all content emitted so far
        self._buffer = ""  # text not emitted yet
        self._state = "content"  # content | header | arguments
        self._held = ""  # trailing whitespace of the content, not emitted yet
        self._after_block = False  # the content resumes after a block: its leading whitespace is dropped

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """(content, call deltas) that this text completes; `final` releases what was held back."""
        self._buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        handlers = {"content": self._in_content, "header": self._in_header, "arguments": self._in_arguments}
        while handlers[self._state](content, deltas, final):
            pass
        self.content += "".join(content)
        return "".join(content), deltas

    def _in_content(self, content: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        start = self._buffer.find(CALL_START)
        if start >= 0:
            self._add_content(self._buffer[:start], content)
            self._held = ""  # whitespace before a block is not content
            self._buffer = self._buffer[start + len(CALL_START):]
            self._state = "header"
            return True
        keep = 0 if final else _partial_suffix(self._buffer, CALL_START)
        cut = len(self._buffer) - keep
        self._add_content(self._buffer[:cut], content)
        self._buffer = self._buffer[cut:]
        if final:
            if not self.calls:  # a plain answer keeps its text as it is
                content.append(self._held)
            self._held = ""
        return False

    def _add_content(self, text: str, content: list[str]) -> None:
        """Content up to its trailing whitespace, which waits: a block may follow (then it is dropped)."""
        if self._after_block:  # whitespace after a block is not content either
            text = text.lstrip()
            self._after_block = not text
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body):]
        if body:
            content.append(body)

    def _in_header(self, content: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        match = _HEADER.match(self._buffer)
        if match and (match.end() < len(self._buffer) or final):  # whitespace after the colon may still come
            call = ParsedCall(new_call_id(), json.loads(f'"{match.group(1)}"'))
            self.calls.append(call)
            deltas.append(ToolCallDelta(len(self.calls) - 1, "", call.id, call.name))
            self._buffer = self._buffer[match.end():]
            self._state = "arguments"
            return True
        end = self._buffer.find(CALL_END)
        if end < 0 and not final:
            return False
        block = self._buffer if end < 0 else self._buffer[:end]
        self._buffer = "" if end < 0 else self._buffer[end + len(CALL_END):]
        self._state = "content"
        self._after_block = True
        call = _whole_call(block) if end >= 0 else None
        if call is None:  # not a call after all: the text is content
            content.append(CALL_START + block + ("" if end < 0 else CALL_END))
            return end >= 0
        self.calls.append(call)
        deltas.append(ToolCallDelta(len(self.calls) - 1, "", call.id, call.name))
        deltas.append(ToolCallDelta(len(self.calls) - 1, call.arguments))
        return True

    def _in_arguments(self, content: list[str], deltas: list[ToolCallDelta], final: bool) -> bool:
        end = self._buffer.find(CALL_END)
        if end >= 0:
            piece = self._buffer[:end].rstrip()
            piece = piece[:-1].rstrip() if piece.endswith("}") else piece
            self._buffer = self._buffer[end + len(CALL_END):]
            self._state = "content"
            self._after_block = True
        elif final:
            piece, self._buffer = self._buffer, ""
        else:
            partial = _partial_suffix(self._buffer, CALL_END)
            head = self._buffer[:len(self._buffer) - partial]
            tail = _ARGUMENTS_TAIL.search(head)
            cut = tail.start() if tail is not None else len(head)
            piece, self._buffer = self._buffer[:cut], self._buffer[cut:]
        if piece:
            self.calls[-1].arguments += piece
            deltas.append(ToolCallDelta(len(self.calls) - 1, piece))
        return end >= 0


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (it may complete with the next text)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _whole_call(block: str) -> ParsedCall | None:
    """A call written in another key order: {"arguments": ..., "name": ...}."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str) -> tuple[str | None, list[ParsedCall]]:
    """(content or None, calls) of a whole answer."""
    parser = ToolCallParser()
    parser.feed(text, final=True)
    return parser.content or None, parser.calls
