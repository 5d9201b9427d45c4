"""The scheduler's configuration: one frozen dataclass, filled once from CLI flags / environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.shared.speculative_config import SpeculativeConfig


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 512  # token budget of one step (decodes + prefill chunks)
    max_num_seqs: int = 64  # running requests at most
    enable_chunked_prefill: bool = True  # split long prompts so that decodes keep streaming
    enable_prefix_caching: bool = True  # reuse the KV blocks of prompt prefixes seen before (automatic)
    watermark: float = 0.01  # fraction of blocks admissions leave free, so running decodes are not starved
    # A prompt whose rest exceeds what is left of the step's budget by at most this many tokens is finished in the
    # step instead of leaving a short tail for the next: its first token comes a whole step earlier, and a step
    # may hold budget + slack tokens.
    prefill_finish_slack: int | None = None  # tokens a step may pass its budget by to finish a prompt (None: 1/8)
    speculative_config: str = field(default="", metadata={"help": (
        'speculative decoding as vLLM\'s JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 4, "disable_by_batch_size": 8}\' or \'{"method": '
        '"draft_model", "model": "DRAFT_DIR", "num_speculative_tokens": 4}\' (empty: off; the worker needs the '
        'same value; docs/speculative_decoding.md)')})

    @property
    def finish_slack(self) -> int:
        return self.max_num_batched_tokens // 8 if self.prefill_finish_slack is None else self.prefill_finish_slack

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
        if self.prefill_finish_slack is not None and self.prefill_finish_slack < 0:
            raise ValueError("prefill_finish_slack must be >= 0")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError("watermark must be in [0, 1)")
        SpeculativeConfig.from_json(self.speculative_config)  # refuses a bad one at start
