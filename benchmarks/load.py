"""Offered load: when each request is sent (arrival schedule) and how many may be in flight."""

import math
from dataclasses import dataclass, replace

import numpy as np

SWEEP_KEYS = ("max-concurrency", "request-rate")


@dataclass(frozen=True)
class LoadPoint:
    request_rate: float = math.inf  # requests/s; inf sends everything at t=0
    burstiness: float = 1.0  # gamma shape of inter-arrival gaps; 1 is Poisson, < 1 burstier, > 1 steadier
    max_concurrency: int | None = None  # None: no limit

    def __post_init__(self):
        if not self.request_rate > 0:
            raise ValueError("--request-rate must be > 0 (inf for all at once)")
        if not self.burstiness > 0:
            raise ValueError("--burstiness must be > 0")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("--max-concurrency must be >= 1")

    @property
    def label(self) -> str:
        """Stable key that names the point in results, plots and compare."""
        return f"request_rate={_fmt(self.request_rate)},max_concurrency={self.max_concurrency or 'inf'}"

    def as_dict(self) -> dict:
        rate = None if math.isinf(self.request_rate) else self.request_rate  # JSON has no inf
        return {"request_rate": rate, "burstiness": self.burstiness, "max_concurrency": self.max_concurrency}


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:g}"


def arrival_offsets_s(num_requests: int, point: LoadPoint, rng: np.random.Generator) -> np.ndarray:
    """Send times relative to the start: 0 for the first, then gamma gaps with mean 1/rate."""
    if math.isinf(point.request_rate):
        return np.zeros(num_requests)
    scale_s = 1.0 / (point.request_rate * point.burstiness)  # mean gap = shape * scale = 1 / rate
    gaps_s = rng.gamma(shape=point.burstiness, scale=scale_s, size=max(num_requests - 1, 0))
    return np.concatenate([[0.0], np.cumsum(gaps_s)])


def parse_sweep(spec: str, base: LoadPoint) -> list[LoadPoint]:
    """`max-concurrency=1,4,16` or `request-rate=1,2,inf` -> one LoadPoint per value, the rest from `base`."""
    key, sep, values = spec.partition("=")
    if not sep or key not in SWEEP_KEYS or not values:
        raise ValueError(f"--sweep must look like max-concurrency=1,4,16 or request-rate=1,2,inf; got {spec!r}")
    points = []
    for value in values.split(","):
        if key == "max-concurrency":
            points.append(replace(base, max_concurrency=int(value)))
        else:
            points.append(replace(base, request_rate=float(value)))
    return points


def offered_load(point: LoadPoint, sweep_key: str | None) -> float:
    """The x value of a point in sweep plots."""
    if sweep_key == "request-rate":
        return point.request_rate
    return float(point.max_concurrency or math.inf)
