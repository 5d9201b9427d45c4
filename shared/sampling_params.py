"""Per-request sampling parameters, shared by the gateway, the scheduler and the worker."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.shared.sampling_bounds import NUMBER_RANGES
from pagedserve.shared.structured_output import StructuredOutput

# Widths of the wire fields (proto/pagedserve/v1/common.proto) these values travel in: a value past them cannot be
# sent, so it is refused here, where it becomes a 400 naming the field, instead of failing the protobuf encoder.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_LOGPROBS = 20  # top alternatives per token, for `logprobs` and `prompt_logprobs` alike (OpenAI's bound)


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; `param` names it (maps to a 400 with `param`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0
    seed: int | None = None  # per-request seed: same seed, same prompt -> same output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: no logprobs; N >= 0: sampled token plus top-N
    # None: none; N >= 0: each prompt token after the first gets its logprob plus the top-N at its position
    # (the whole prompt is computed: such a request never reads the prefix cache)
    prompt_logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # EOS never ends the answer: the worker bans it, so answers run to max_tokens
    structured_output: StructuredOutput | None = None  # the grammar every output token must follow

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.max_tokens <= UINT32_MAX, "max_tokens",
             f"max_tokens must be at most {UINT32_MAX}, got {self.max_tokens}"),
            (self.min_tokens >= 0, "min_tokens", f"min_tokens must be non-negative, got {self.min_tokens}"),
            (self.min_tokens <= self.max_tokens, "min_tokens",
             f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"),
            (NUMBER_RANGES["temperature"].contains(self.temperature), "temperature",
             f"temperature must be non-negative and finite, got {self.temperature}"),
            (NUMBER_RANGES["top_p"].contains(self.top_p), "top_p", f"top_p must be in (0, 1], got {self.top_p}"),
            (-1 <= self.top_k <= INT32_MAX, "top_k",
             f"top_k must be -1, 0 (disabled) or positive up to {INT32_MAX}, got {self.top_k}"),
            (NUMBER_RANGES["min_p"].contains(self.min_p), "min_p", f"min_p must be in [0, 1], got {self.min_p}"),
            (NUMBER_RANGES["presence_penalty"].contains(self.presence_penalty), "presence_penalty",
             f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (NUMBER_RANGES["frequency_penalty"].contains(self.frequency_penalty), "frequency_penalty",
             f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (NUMBER_RANGES["repetition_penalty"].contains(self.repetition_penalty), "repetition_penalty",
             f"repetition_penalty must be positive and finite, got {self.repetition_penalty}"),
            (self.seed is None or INT64_MIN <= self.seed <= INT64_MAX, "seed",
             f"seed must be a 64-bit signed integer (between {INT64_MIN} and {INT64_MAX}), got {self.seed}"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs",
             f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise SamplingParamsError(message, param)
        for token_id, bias in self.logit_bias.items():
            if not NUMBER_RANGES["logit_bias"].contains(bias):
                raise SamplingParamsError(f"logit_bias values must be in [-100, 100], got {bias}", "logit_bias")
            if not 0 <= token_id <= INT32_MAX:
                raise SamplingParamsError(f"logit_bias token ids must be between 0 and {INT32_MAX}, got {token_id}",
                                          "logit_bias")
        bad_stop = next((t for t in self.stop_token_ids if not 0 <= t <= INT32_MAX), None)
        if bad_stop is not None:
            raise SamplingParamsError(f"stop_token_ids must be between 0 and {INT32_MAX}, got {bad_stop}",
                                      "stop_token_ids")
