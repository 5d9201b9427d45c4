"""Request body of POST /v1/responses (OpenAI's Responses API), as far as this server serves it.

Input items are a discriminated union on `type` (a message may leave it out), so an item or content part this server
cannot take (an image, a built-in tool's call, an item reference) is a 400 naming its place and its type. Tools stay
plain objects here: responses_input.py refuses the built-in ones by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from pagedserve.services.gateway.api.protocol import _Body, _Request


class TextPart(_Body):
    """Text in a message: `input_text` from the user, `output_text` from an earlier answer sent back."""

    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(_Body):
    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | RefusalPart, Field(discriminator="type")]


class MessageItem(_Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal for part in self.content)


class FunctionCallItem(_Body):
    """A call the model made (an earlier answer's output item, sent back)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text


class FunctionCallOutputItem(_Body):
    """The client's result of a call, answered by call_id."""

    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)


class ReasoningItem(_Body):
    """An earlier answer's reasoning, sent back: accepted and left out of the prompt (chat templates drop past
    reasoning too)."""

    type: Literal["reasoning"]


def _item_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("type", "message")
    return getattr(value, "type", None)


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
                      | Annotated[ReasoningItem, Tag("reasoning")], Discriminator(_item_type)]


_ITEMS = TypeAdapter(list[InputItem])


def _item_error(exc: ValidationError) -> PydanticCustomError:
    """The first bad item or part by its place (input[i].content[j]), preferring an unknown type's error."""
    errors = exc.errors()
    error = next((e for e in errors if e["type"] == "union_tag_invalid"), errors[0])
    path = "input" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]
                             if isinstance(p, int) or p in _FIELD_NAMES)
    return PydanticCustomError("input_item", "{param}: {reason}", {"param": path, "reason": error["msg"]})


_FIELD_NAMES = ("role", "content", "call_id", "name", "arguments", "output", "text", "type")


class TextFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema: the schema's label
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Body):
    format: TextFormat | None = None
    verbosity: str | None = None  # accepted; not used


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None  # a system message before the input; not carried over by previous_response_id
    previous_response_id: str | None = None  # a stored response whose conversation this one continues
    store: bool | None = True  # keep the response for GET and previous_response_id (None: as true)
    stream: bool | None = False
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None  # function tools only; built-in ones are refused by name
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None  # echoed back
    user: str | None = None  # accepted; not used
    truncation: Literal["disabled"] | None = None  # "auto" (drop old turns to fit) is not served
    reasoning: dict[str, Any] | None = None  # accepted; a reasoning parser decides what is reasoning
    background: Literal[False] | None = None  # background responses are not served
    # vLLM's sampling extras and chat-template fields, passed to the chat path as they are
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input_items(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        try:
            return _ITEMS.validate_python(value)
        except ValidationError as exc:
            raise _item_error(exc) from None
