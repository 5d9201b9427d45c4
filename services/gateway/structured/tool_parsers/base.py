"""What every tool-call family provides: where its calls open in the text, how one whole call block reads, and the
structural tag that makes the model write valid calls in that format.

A family never returns half a call: `next_block` answers None until the block it starts is complete, so a call cut
by `max_tokens` is dropped rather than returned with arguments that do not parse.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

from pagedserve.services.gateway.api.protocol import FunctionDefinition

NO_PARAMETERS = {"type": "object", "properties": {}}
MAX_WHITESPACE = 1  # JSON in a call holds at most one whitespace character in a row: no whitespace loops


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedCall:
    id: str
    name: str
    arguments: str  # JSON text of an object: always parses

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parsed_call(name: Any, arguments: Any) -> ParsedCall | None:
    """A call from a decoded name and arguments object; None when they are not a name and an object."""
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ParsedCall(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


@dataclass(frozen=True)
class CallBlock:
    """A whole block from the start of the text it was given: its calls (none when it was malformed: it is dropped,
    never returned as content) and how many characters it took."""

    calls: list[ParsedCall]
    consumed: int


class ToolCallFormat:
    """One family's call format. Subclasses set `name`, `triggers` and implement `next_block`, `call_tag` and
    `format_call`."""

    name: ClassVar[str]
    triggers: ClassVar[tuple[str, ...]]  # texts that open a call block (each begins every call tag in auto mode)
    only_at_start: ClassVar[tuple[str, ...]] = ()  # triggers that open calls only at the answer's start
    separator: ClassVar[str] = "\n"  # between parallel calls in the grammar
    instruction: ClassVar[str] = "answer in this form"  # how the tools section (templates without tools) asks

    def __init__(self, functions: list[FunctionDefinition]) -> None:
        self.functions = {f.name: f for f in functions}

    def next_block(self, text: str, final: bool) -> CallBlock | None:
        """The block `text` starts with (text begins with one of the triggers); None while it is incomplete and
        more text may come. With `final`, an incomplete block is a CallBlock with no calls taking all of text."""
        raise NotImplementedError

    def call_tag(self, function: FunctionDefinition) -> dict:
        """xgrammar's structural-tag `tag` for one call of `function` in this format."""
        raise NotImplementedError

    def format_call(self, name: str, arguments: Any) -> str:
        """One call as the model writes it (past calls in a prompt without native tool support)."""
        raise NotImplementedError

    def example(self) -> str:
        """A call with placeholders, for the tools section."""
        example = self.format_call("<function-name>", "<arguments-object>")
        return example.replace('"<function-name>"', "<function-name>").replace('"<arguments-object>"',
                                                                              "<arguments-object>")

    def parameters(self, name: str) -> dict:
        function = self.functions.get(name)
        return (function.parameters if function is not None else None) or NO_PARAMETERS


def json_schema_content(parameters: dict) -> dict:
    return {"type": "json_schema", "json_schema": parameters, "max_whitespace_cnt": MAX_WHITESPACE}


def skip_whitespace(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def decode_json(text: str, at: int) -> tuple[Any, int] | None:
    """(value, end) of the JSON value at `at`; None while it is incomplete or malformed."""
    try:
        return json.JSONDecoder().raw_decode(text, at)
    except json.JSONDecodeError:
        return None


def end_tag_at(text: str, at: int, tag: str, final: bool) -> int | None:
    """Where the block ends given that `tag` (after optional whitespace) should close it at `at`: after the tag when
    it is there; None while the rest may still become it; `at` when something else follows or the text is final."""
    rest = skip_whitespace(text, at)
    if text.startswith(tag, rest):
        return rest + len(tag)
    if not final and tag.startswith(text[rest:]):
        return None
    return len(text) if final and tag.startswith(text[rest:]) else at
