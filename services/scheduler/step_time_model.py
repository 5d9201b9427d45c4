"""A step's expected duration from its size: a least-squares line, time = base + cost per token x scheduled tokens,
over recent steps (exponentially weighted).

On a CPU a step's time grows with its tokens (a 40-token prompt chunk costs a few decode steps), so one average
step time predicts the end of a prompt step too early and of a decode step too late; the engine loop plans its next
step by that prediction (late planning) and tells refused arrivals when it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_TOKEN_SPREAD = 1.0  # variance of the recent steps' token counts below which the line is taken flat


@dataclass
class StepTimeModel:
    decay: float = 0.95  # weight the past keeps at each new step (the last ~20 steps count)
    _weight: float = 0.0  # exponentially weighted sums of 1, tokens, seconds, tokens^2, tokens x seconds
    _tokens: float = 0.0
    _seconds: float = 0.0
    _tokens_sq: float = 0.0
    _tokens_seconds: float = 0.0

    def record(self, num_tokens: int, duration_s: float) -> None:
        d = self.decay
        self._weight = d * self._weight + 1.0
        self._tokens = d * self._tokens + num_tokens
        self._seconds = d * self._seconds + duration_s
        self._tokens_sq = d * self._tokens_sq + num_tokens * num_tokens
        self._tokens_seconds = d * self._tokens_seconds + num_tokens * duration_s

    def predict_s(self, num_tokens: int) -> float | None:
        """Seconds a step of `num_tokens` tokens is expected to take; None before any step was recorded."""
        if not self._weight:
            return None
        mean_tokens, mean_s = self._tokens / self._weight, self._seconds / self._weight
        spread = self._tokens_sq / self._weight - mean_tokens * mean_tokens
        slope = 0.0
        if spread >= MIN_TOKEN_SPREAD:
            slope = max(0.0, (self._tokens_seconds / self._weight - mean_tokens * mean_s) / spread)
        return max(0.0, mean_s + slope * (num_tokens - mean_tokens))
