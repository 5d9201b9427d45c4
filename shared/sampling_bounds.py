"""The value ranges of the sampling parameters, in one place: SamplingParams (shared/sampling_params.py) enforces
them for every request, from the gateway or any other gRPC client, and the gateway's /openapi.json documents them
(services/gateway/api/openapi_schema.py). Ranges that depend on the served model (token ids, lengths) are not here."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """A closed or half-open range of finite numbers; None: unbounded on that side."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None

    def contains(self, value: float) -> bool:
        return (math.isfinite(value) and (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum)
                and (self.exclusive_minimum is None or value > self.exclusive_minimum))

    def json_schema(self) -> dict[str, float]:
        """The range as JSON Schema keywords (minimum, maximum, exclusiveMinimum)."""
        keywords = {"minimum": self.minimum, "maximum": self.maximum, "exclusiveMinimum": self.exclusive_minimum}
        return {key: value for key, value in keywords.items() if value is not None}


NUMBER_RANGES: dict[str, Range] = {  # request field -> the range of every number in it (logit_bias: its values)
    "temperature": Range(minimum=0),
    "top_p": Range(exclusive_minimum=0, maximum=1),
    "min_p": Range(minimum=0, maximum=1),
    "presence_penalty": Range(minimum=-2, maximum=2),
    "frequency_penalty": Range(minimum=-2, maximum=2),
    "repetition_penalty": Range(exclusive_minimum=0),
    "logit_bias": Range(minimum=-100, maximum=100),
}
