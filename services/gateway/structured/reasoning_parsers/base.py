"""What every reasoning family provides: how its answer begins (reasoning first, or only if the model opens a think
block) and the tags around the reasoning. The streaming split is common (ReasoningSplitter)."""

from __future__ import annotations

from typing import ClassVar

THINK_START, THINK_END = "<think>", "</think>"


class ReasoningFormat:
    name: ClassVar[str]
    starts_in_reasoning: ClassVar[bool]  # the prompt opened the think block: the output begins inside it
    start: ClassVar[str] = THINK_START
    end: ClassVar[str] = THINK_END


class ReasoningSplitter:
    """Splits streamed text into (reasoning, content). The reasoning is what lies inside the think block (its tags
    dropped); an output cut inside it (or inside its start tag) is all reasoning. A format that does not start in
    reasoning treats an output that does not open with the start tag as all content."""

    def __init__(self, reasoning_format: type[ReasoningFormat]) -> None:
        self.format = reasoning_format
        self._state = "reasoning" if reasoning_format.starts_in_reasoning else "undecided"
        self._buffer = ""
        self._opened = False  # the start tag (optional in reasoning-first formats) is behind us
        self.reasoning = ""  # all reasoning emitted so far
        self._after_end = False  # the answer's leading whitespace (after the end tag) is dropped

    @property
    def in_answer(self) -> bool:
        return self._state == "content"

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(reasoning, content) that this text completes; `final` releases what was held back."""
        self._buffer += text
        reasoning, content = "", ""
        if self._state != "content":
            reasoning = self._reasoning(final)
        if self._state == "content":
            content, self._buffer = self._buffer, ""
            if self._after_end:
                content = content.lstrip()
                self._after_end = not content
        self.reasoning += reasoning
        return reasoning, content

    def _reasoning(self, final: bool) -> str:
        start, end = self.format.start, self.format.end
        lead = self._buffer.lstrip()
        if not self._opened:
            if lead.startswith(start):
                self._buffer, self._opened, self._state = lead[len(start):], True, "reasoning"
            elif start.startswith(lead) and not final:
                return ""  # may still become the start tag
            elif start.startswith(lead) and lead:  # cut inside the start tag: an empty reasoning
                self._buffer, self._opened, self._state = "", True, "reasoning"
                return ""
            elif self._state == "undecided":
                self._state = "content"  # no think block: the whole output is the answer
                return ""
            else:
                self._opened = True
        at = self._buffer.find(end)
        if at >= 0:
            reasoning, self._buffer = self._buffer[:at], self._buffer[at + len(end):]
            self._state, self._after_end = "content", True
            return reasoning
        keep = _partial_suffix(self._buffer, end)  # at the end of the output: a cut end tag, dropped
        reasoning, self._buffer = self._buffer[:len(self._buffer) - keep], self._buffer[len(self._buffer) - keep:]
        if final:
            self._buffer = ""
        return reasoning


def _partial_suffix(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
