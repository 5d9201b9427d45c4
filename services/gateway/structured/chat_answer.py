"""A chat answer split into its parts: reasoning (reasoning parser), then tool calls and content (tool-call parser),
whole or as OpenAI stream deltas. Reasoning goes to `reasoning_content` and to `reasoning` (vLLM's newer name)."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.gateway.api.generation import ChoiceResult
from pagedserve.services.gateway.structured.chat_tool_calls import delta_of, finish_reason
from pagedserve.services.gateway.structured.reasoning_parsers import ReasoningFormat, ReasoningSplitter
from pagedserve.services.gateway.structured.tool_parser import ToolCallDelta, ToolCallParser
from pagedserve.services.gateway.structured.tools import ToolPlan


@dataclass(frozen=True)
class AnswerParsing:
    tools: ToolPlan | None  # None: no calls parsed (no tools, or tool_choice none)
    reasoning: type[ReasoningFormat] | None  # None: no reasoning split

    @property
    def active(self) -> bool:
        return self.tools is not None or self.reasoning is not None


class ChoiceAnswer:
    """One choice's parsers, fed its text as it comes."""

    def __init__(self, parsing: AnswerParsing) -> None:
        self.parsing = parsing
        self.reasoning = ReasoningSplitter(parsing.reasoning) if parsing.reasoning is not None else None
        self.calls = ToolCallParser(parsing.tools.format, parsing.tools.forced) if parsing.tools is not None else None
        self.content = ""

    def feed(self, text: str, final: bool) -> tuple[str, str, list[ToolCallDelta]]:
        """(reasoning, content, call deltas) this text completes."""
        reasoning, answer = self.reasoning.feed(text, final) if self.reasoning is not None else ("", text)
        content, calls = self.calls.feed(answer, final) if self.calls is not None else (answer, [])
        self.content += content
        return reasoning, content, calls

    @property
    def num_calls(self) -> int:
        return len(self.calls.calls) if self.calls is not None else 0

    def finish(self, finish: str | None) -> str | None:
        return finish_reason(self.parsing.tools, finish, self.num_calls) if self.parsing.tools else finish


def message_of(parsing: AnswerParsing, result: ChoiceResult) -> tuple[dict, str | None, str]:
    """(the assistant message, the finish reason, the reasoning text) of a whole answer."""
    answer = ChoiceAnswer(parsing)
    reasoning, _, _ = answer.feed(result.text, final=True)
    message: dict = {"role": "assistant", "content": answer.content or (None if answer.calls else "")}
    if answer.reasoning is not None:
        message["reasoning_content"] = message["reasoning"] = reasoning or None
    if answer.calls is not None and answer.calls.calls:
        message["tool_calls"] = [call.to_openai() for call in answer.calls.calls]
    return message, answer.finish(result.finish_reason), reasoning


class StreamedAnswers:
    """The deltas (OpenAI `delta` objects plus the finish reason) of each choice of a streamed answer."""

    def __init__(self, parsing: AnswerParsing) -> None:
        self.parsing = parsing
        self.choices: dict[int, ChoiceAnswer] = {}

    def deltas(self, index: int, text: str, finish: str | None) -> list[tuple[dict, str | None]]:
        answer = self.choices.setdefault(index, ChoiceAnswer(self.parsing))
        reasoning, content, calls = answer.feed(text, final=finish is not None)
        out: list[tuple[dict, str | None]] = []
        if reasoning:
            out.append(({"reasoning_content": reasoning, "reasoning": reasoning}, None))
        if content:
            out.append(({"content": content}, None))
        out += [({"tool_calls": [delta_of(call)]}, None) for call in calls]
        if finish is not None:
            out.append(({}, answer.finish(finish)))
        return out

    def reasoning_texts(self) -> list[str]:
        return [answer.reasoning.reasoning for answer in self.choices.values() if answer.reasoning is not None]
