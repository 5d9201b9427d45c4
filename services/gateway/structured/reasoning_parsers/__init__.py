"""Reasoning formats per model family (`--reasoning-parser`), one file each, and the default for a chat template."""

from __future__ import annotations

from pagedserve.services.gateway.structured.reasoning_parsers.base import ReasoningFormat, ReasoningSplitter
from pagedserve.services.gateway.structured.reasoning_parsers.deepseek_r1 import DeepSeekR1Reasoning
from pagedserve.services.gateway.structured.reasoning_parsers.qwen3 import Qwen3Reasoning

REASONING_FORMATS: dict[str, type[ReasoningFormat]] = {cls.name: cls for cls in (Qwen3Reasoning, DeepSeekR1Reasoning)}

__all__ = ["REASONING_FORMATS", "ReasoningFormat", "ReasoningSplitter", "default_reasoning_parser"]


def default_reasoning_parser(chat_template: str | None) -> str:
    """The family a chat template names unambiguously; "" (no reasoning split) otherwise."""
    template = chat_template or ""
    if "<think>" not in template:
        return ""
    r1 = "<｜Assistant｜>" in template  # DeepSeek's full-width bars
    qwen3 = "enable_thinking" in template
    return "deepseek_r1" if r1 and not qwen3 else "qwen3" if qwen3 and not r1 else ""
