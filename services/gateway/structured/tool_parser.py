"""Tool calls out of the model's text as it streams, in the format of the model's family (tool_parsers/).

Text outside call blocks is content; whitespace next to a block is not, and neither is any of a block's markup: a
malformed block, or one cut by the end of the output (even inside its trigger, from its second character on), is
dropped whole. A call is emitted once its block is
complete, as OpenAI's deltas: its index, id and name with empty arguments, then its whole arguments (JSON that
parses). A non-streamed answer is parsed by the same code fed the whole text, so streamed deltas always reassemble
to the non-streamed result.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.gateway.structured.tool_parsers.base import ParsedCall, ToolCallFormat

MIN_CUT_TRIGGER = 2  # an output that ends in this much of a trigger (`<t`) was opening a call: it is dropped


@dataclass
class ToolCallDelta:
    index: int  # the call's index in the answer
    arguments: str
    id: str | None = None  # on the call's first delta
    name: str | None = None  # on the call's first delta


class ToolCallParser:
    def __init__(self, call_format: ToolCallFormat, forced: bool = False) -> None:
        self.format = call_format
        self._min_cut_trigger = 1 if forced else MIN_CUT_TRIGGER  # forced calls: the answer holds nothing else
        self.calls: list[ParsedCall] = []
        self.content = ""  # all content emitted so far
        self._buffer = ""  # text not emitted yet
        self._in_block = False  # the buffer starts with a call block's trigger
        self._held = ""  # trailing whitespace of the content, not emitted yet
        self._after_block = False  # the content resumes after a block: its leading whitespace is dropped

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """(content, call deltas) that this text completes; `final` releases or drops what was held back."""
        self._buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while self._in_call(deltas, final) if self._in_block else self._in_content(content, final):
            pass
        self.content += "".join(content)
        return "".join(content), deltas

    def _in_call(self, deltas: list[ToolCallDelta], final: bool) -> bool:
        block = self.format.next_block(self._buffer, final)
        if block is None:
            return False
        for call in block.calls:
            self.calls.append(call)
            deltas.append(ToolCallDelta(len(self.calls) - 1, "", call.id, call.name))
            deltas.append(ToolCallDelta(len(self.calls) - 1, call.arguments))
        self._buffer = self._buffer[block.consumed:]
        self._in_block, self._after_block = False, True
        return True

    def _in_content(self, content: list[str], final: bool) -> bool:
        at_start = not self.content and not content  # only whitespace and calls so far
        start = self._trigger_at(at_start)
        if start >= 0:
            self._add_content(self._buffer[:start], content)
            self._held = ""  # whitespace before a block is not content
            self._buffer = self._buffer[start:]
            self._in_block = True
            return True
        keep = max((_partial_suffix(self._buffer, t) for t in self.format.triggers
                    if t not in self.format.only_at_start), default=0)
        if final and keep < self._min_cut_trigger:
            keep = 0
        cut = len(self._buffer) - keep
        self._add_content(self._buffer[:cut], content)
        self._buffer = self._buffer[cut:]
        if final:
            if not self.calls and not keep:  # a plain answer keeps its text as it is
                content.append(self._held)
            self._held, self._buffer = "", ""  # a trigger cut by the end of the output is dropped
        return False

    def _trigger_at(self, at_start: bool) -> int:
        """Where the first call block opens in the buffer; -1 when none does."""
        found = [self._buffer.find(t) for t in self.format.triggers if t not in self.format.only_at_start]
        if at_start:
            lead = len(self._buffer) - len(self._buffer.lstrip())
            found += [lead for t in self.format.only_at_start if self._buffer.startswith(t, lead)]
        found = [at for at in found if at >= 0]
        return min(found, default=-1)

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


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag` (it may complete with the next text)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def parse_tool_calls(text: str, call_format: ToolCallFormat, forced: bool = False
                     ) -> tuple[str | None, list[ParsedCall]]:
    """(content or None, calls) of a whole answer."""
    parser = ToolCallParser(call_format, forced)
    parser.feed(text, final=True)
    return parser.content or None, parser.calls
