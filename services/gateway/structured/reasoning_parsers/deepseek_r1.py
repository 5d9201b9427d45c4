"""DeepSeek-R1: the template opens the think block in the prompt (`<think>\\n`), so the output begins inside it,
usually with no opening tag (one written anyway is dropped); reasoning runs to `</think>`."""

from __future__ import annotations

from pagedserve.services.gateway.structured.reasoning_parsers.base import ReasoningFormat


class DeepSeekR1Reasoning(ReasoningFormat):
    name = "deepseek_r1"
    starts_in_reasoning = True
