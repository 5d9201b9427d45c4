"""Qwen3: the model opens its own think block (`<think>...</think>` then the answer); with thinking off the
template closes an empty block in the prompt and the output is all answer."""

from __future__ import annotations

from pagedserve.services.gateway.structured.reasoning_parsers.base import ReasoningFormat


class Qwen3Reasoning(ReasoningFormat):
    name = "qwen3"
    starts_in_reasoning = False
