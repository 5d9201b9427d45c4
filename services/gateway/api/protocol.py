"""Request bodies of the OpenAI-compatible API (pydantic). Types and shape limits here; sampling value ranges are
checked in sampling.py.

An explicit JSON null is the field's default (the OpenAI spec and vLLM accept null for optional fields). What other
fields get (refused, accepted as no-ops, or ignored with a warning) is in request_fields.py. Every string of a
request must be valid Unicode (JSON's `\\ud800` escape decodes to a lone surrogate, which no tokenizer, protobuf
or UTF-8 encoder takes) and every number finite.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_STOP_STRINGS = 16  # stop strings are matched against every delta: their number and length bound that work
MAX_STOP_STRING_CHARS = 256
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_path(value: Any, path: str = "") -> str | None:
    """The dotted path of the first string (value or dict key) holding a lone surrogate; None when all are valid."""
    if isinstance(value, str):
        return path if _LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{ascii(key)[1:-1]}" if path else ascii(key)[1:-1]
            found = where if isinstance(key, str) and _LONE_SURROGATE.search(key) else lone_surrogate_path(item, where)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if type(item) is not int:  # prompts of token ids: skip their elements cheaply
                found = lone_surrogate_path(item, f"{path}.{i}")
                if found is not None:
                    return found
    return None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`"n": null` means the default, as for a field left out."""
        if isinstance(data, dict) and None in data.values():
            return {key: value for key, value in data.items() if value is not None}
        return data


class _Request(_Body):
    """A whole request body: refused (400, with the field as `param`) when any string in it is not valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        path = lone_surrogate_path(data)
        if path is not None:
            raise PydanticCustomError("lone_surrogate", "'{param}': the text holds a lone UTF-16 surrogate (an "
                                      "unpaired \\ud800-\\udfff escape), which is not valid Unicode",
                                      {"param": path})
        return data


class StreamOptions(_Body):
    include_usage: bool = False  # a last chunk with usage before [DONE]


class JsonSchemaFormat(_Body):
    name: str | None = None  # OpenAI's label for the schema; not used
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None  # true: a schema keyword the grammar cannot enforce is a 400 instead of ignored


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None  # with type json_schema
    format: dict[str, Any] | None = None  # with type structural_tag: an xgrammar structural tag format (vLLM)


class StructuredOutputsParams(_Body):
    """vLLM's `structured_outputs` extra: exactly one constraint."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")  # a JSON schema
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF (xgrammar / GBNF dialect) or Lark
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool | None = None  # default here: true (compact JSON; small models loop on whitespace)


class SamplingFields(_Request):
    """Fields chat and completions share."""

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = None  # None: generation_config.json's, else 1.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None  # at most MAX_STOP_STRINGS, each at most MAX_STOP_STRING_CHARS long
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted for compatibility (OpenAI's end-user id); not used
    priority: int | None = None  # vLLM's scheduling priority: accepted, not used yet (the tenants issue wires it)
    include_stop_str_in_output: bool = False  # keep the stop string that ended the answer in its text (vLLM)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)  # keep the prompt's last k tokens; -1: the context's
    cache_salt: str | None = None  # separates prefix-cache entries between tenants
    priority: int | None = Field(None, ge=-(2**31), le=2**31 - 1)  # vLLM's: lower is sooner; bounded by the tenant
    response_format: ResponseFormat | None = None  # OpenAI's JSON mode / JSON schema (completions too, as vLLM)
    structured_outputs: StructuredOutputsParams | None = None  # vLLM's constraints (json, regex, choice, grammar)
    guided_json: dict[str, Any] | str | None = None  # vLLM's names before structured_outputs (removed in its 0.12)
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob plus the top N (non-streamed answers)

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
            raise ValueError(f"a stop string may be at most {MAX_STOP_STRING_CHARS} characters long")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class TextPart(_Body):
    type: Literal["text"]
    text: str


def _text_parts_only(content: Any) -> Any:
    """Content parts other than text (image_url, input_audio, file, ...) are refused by name: the model reads text."""
    for i, part in enumerate(content if isinstance(content, list) else []):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind is not None and kind != "text":
            raise ValueError(f"part {i} is of type {kind!r}: content parts other than text are not supported "
                             f"(this model takes text only)")
    return content


class ToolCallFunction(_Body):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        return _text_parts_only(content)

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        """OpenAI's `developer` role is its newer name for `system` (templates know only the latter)."""
        return "system" if role == "developer" else role

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatTemplateFields(_Request):
    """vLLM's chat-template request fields (chat completions and /tokenize with messages)."""

    chat_template: str | None = None  # a Jinja template for this request (needs --trust-request-chat-template)
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables, e.g. {"enable_thinking": false}
    add_generation_prompt: bool = True  # end the prompt with the assistant's turn header
    continue_final_message: bool = False  # continue the last (assistant) message instead of starting a new one




class FunctionDefinition(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object; None: no arguments
    strict: bool | None = None  # true: a schema keyword the grammar cannot enforce is a 400 instead of ignored


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    model_config = ConfigDict(extra="allow")  # request_fields.py sorts the fields not declared here

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # None: auto with tools
    parallel_tool_calls: bool = True  # false: at most one call per answer
    functions: list[FunctionDefinition] | None = None  # OpenAI's deprecated form of tools: mapped to them
    function_call: Literal["none", "auto"] | NamedFunction | None = None  # ... and of tool_choice
    max_completion_tokens: int | None = None  # the newer name of max_tokens; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None  # 0..20 alternatives per token; needs logprobs=true

    @model_validator(mode="after")
    def _functions_are_tools(self) -> ChatCompletionRequest:
        """The deprecated `functions` / `function_call` become `tools` / `tool_choice` (not together with them)."""
        if self.functions is None and self.function_call is None:
            return self
        if self.tools is not None or self.tool_choice is not None:
            raise PydanticCustomError("legacy_and_tools", "give tools or the deprecated functions, not both",
                                      {"param": "functions"})
        self.tools = [Tool(type="function", function=f) for f in self.functions or []] or None
        call = self.function_call
        self.tool_choice = call if isinstance(call, str) or call is None else NamedToolChoice(
            type="function", function=call)
        self.functions = self.function_call = None
        return self


class CompletionRequest(SamplingFields):
    model_config = ConfigDict(extra="allow")  # request_fields.py sorts the fields not declared here

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # prepend the prompt to the text
    logprobs: int | None = None  # 0..20 alternatives per token
    suffix: str | None = None  # not supported: 400 when set


class TokenizeRequest(ChatTemplateFields):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None  # tokenized through the chat template when given
    tools: list[Tool] | None = None  # rendered with the messages, as a chat request with these tools would be
    add_special_tokens: bool = True


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
