"""Request bodies of the OpenAI-compatible API (pydantic). Types and shape limits here; sampling value ranges are
checked in sampling.py.

Unknown fields are ignored (clients send extras through `extra_body`). Every string of a request must be valid
Unicode (JSON's `\\ud800` escape decodes to a lone surrogate, which no tokenizer, protobuf or UTF-8 encoder takes)
and every number finite.
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
    cache_salt: str | None = None  # separates prefix-cache entries between tenants

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


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

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


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # the newer name of max_tokens; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None  # 0..20 alternatives per token; needs logprobs=true


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # prepend the prompt to the text
    logprobs: int | None = None  # 0..20 alternatives per token
    suffix: str | None = None  # not supported: 400 when set


class TokenizeRequest(ChatTemplateFields):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None  # tokenized through the chat template when given
    add_special_tokens: bool = True


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]
