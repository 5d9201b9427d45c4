"""Request bodies of the OpenAI-compatible API (pydantic). Types only: value ranges are checked in sampling.py.

Unknown fields are ignored (clients send extras through `extra_body`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False  # a last chunk with usage before [DONE]


class SamplingFields(_Body):
    """Fields chat and completions share."""

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = None  # None: generation_config.json's, else 1.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
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


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # the newer name of max_tokens; wins when both are set
    logprobs: bool = False
    top_logprobs: int | None = None  # 0..20 alternatives per token; needs logprobs=true


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False  # prepend the prompt to the text
    logprobs: int | None = None  # 0..20 alternatives per token
    suffix: str | None = None  # not supported: 400 when set


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None  # tokenized through the chat template when given
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
