"""The scheduler's configuration: one frozen dataclass, filled once from CLI flags / environment."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    max_num_seqs: int = 64  # running requests at most
    enable_chunked_prefill: bool = True  # split long prompts so that decodes keep streaming
    enable_prefix_caching: bool = True
    watermark: float = 0.01  # fraction of blocks admissions leave free, so running decodes are not starved

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
