"""Serving metrics from request records: latency distributions, throughput, goodput and failures. Pure functions."""

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from pagedserve.benchmarks.records import RequestRecord

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class MetricsConfig:
    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    percentiles: tuple[float, ...] = (90.0, 95.0, 99.0)  # mean, median and std are always reported
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)  # e.g. {"ttft": 500, "tpot": 50}

    def __post_init__(self):
        for name in self.percentile_metrics:
            if name not in LATENCY_METRICS:
                raise ValueError(f"--percentile-metrics: {name!r} is not one of {LATENCY_METRICS}")
        for p in self.percentiles:
            if not 0 < p < 100:
                raise ValueError(f"--metric-percentiles: {p} is not in (0, 100)")
        for name, slo_ms in self.goodput_slos_ms.items():
            if name not in SLO_METRICS or not slo_ms > 0:
                raise ValueError(f"--goodput: want {'|'.join(SLO_METRICS)}:MS with MS > 0, got {name}:{slo_ms}")


def percentile_key(p: float) -> str:
    return f"p{p:g}"


def summarize_ms(values_ms: list[float], percentiles: tuple[float, ...]) -> dict[str, float | None]:
    """mean, median, std and the given percentiles (linear interpolation); None for every stat if empty."""
    keys = ["mean", "median", "std", *(percentile_key(p) for p in percentiles)]
    if not values_ms:
        return dict.fromkeys(keys)
    array = np.asarray(values_ms, dtype=np.float64)
    stats = [array.mean(), np.median(array), array.std(), *np.percentile(array, percentiles)]
    return {key: float(value) for key, value in zip(keys, stats, strict=True)}


def latency_samples_ms(records: list[RequestRecord]) -> dict[str, list[float]]:
    """Per-metric samples over successful requests; ITL pools the gaps of all requests."""
    ok = [r for r in records if r.ok]
    return {
        "ttft": [r.ttft_s * 1e3 for r in ok],
        "tpot": [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None],
        "itl": [gap_s * 1e3 for r in ok for gap_s in r.itls_s],
        "e2el": [r.e2el_s * 1e3 for r in ok],
    }


def meets_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """A successful request whose TTFT, TPOT and E2EL are within every given SLO (single-token answers pass TPOT)."""
    if not record.ok:
        return False
    values_s = {"ttft": record.ttft_s, "tpot": record.tpot_s or 0.0, "e2el": record.e2el_s}
    return all(values_s[name] * 1e3 <= slo_ms for name, slo_ms in slos_ms.items())


def max_in_flight(records: list[RequestRecord]) -> int:
    """Most requests open at the same instant (ends are processed before starts at equal times)."""
    events = [(r.send_offset_s, 1) for r in records] + [(r.send_offset_s + (r.e2el_s or 0.0), -1) for r in records]
    in_flight = peak = 0
    for _, step in sorted(events):
        in_flight += step
        peak = max(peak, in_flight)
    return peak


def routing_metrics(ok: list[RequestRecord]) -> dict:
    """What the server's usage and headers say about its cache and replicas: the share of prompt tokens served from
    cache (over the requests that report cached tokens; None when none does) and requests per replica."""
    reported = [r for r in ok if r.num_cached_tokens is not None and r.num_prompt_tokens]
    num_prompt = sum(r.num_prompt_tokens for r in reported)
    return {
        "cached_prompt_tokens_ratio": sum(r.num_cached_tokens for r in reported) / num_prompt if num_prompt else None,
        "requests_per_replica": dict(sorted(Counter(r.replica for r in ok if r.replica).items())),
    }


def compute_metrics(records: list[RequestRecord], duration_s: float, cfg: MetricsConfig) -> dict:
    ok = [r for r in records if r.ok]
    num_input_tokens = sum(r.num_prompt_tokens or 0 for r in ok)
    num_output_tokens = sum(r.num_output_tokens or 0 for r in ok)
    metrics = {
        "duration_s": duration_s,
        "num_requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "failures": dict(sorted(Counter(r.error for r in records if not r.ok).items())),
        "num_short_outputs": sum(1 for r in ok if (r.num_output_tokens or 0) < r.num_requested_output_tokens),
        "total_input_tokens": num_input_tokens,
        "total_output_tokens": num_output_tokens,
        "request_throughput_rps": len(ok) / duration_s,
        "output_throughput_tok_s": num_output_tokens / duration_s,
        "total_token_throughput_tok_s": (num_input_tokens + num_output_tokens) / duration_s,
        "max_in_flight": max_in_flight(records),
        **routing_metrics(ok),
    }
    if cfg.goodput_slos_ms:
        num_good = sum(1 for r in ok if meets_slos(r, cfg.goodput_slos_ms))
        metrics |= {"num_good": num_good, "request_goodput_rps": num_good / duration_s}
    samples = latency_samples_ms(records)
    for name in cfg.percentile_metrics:
        for stat, value in summarize_ms(samples[name], cfg.percentiles).items():
            metrics[f"{stat}_{name}_ms"] = value
    return metrics


def latency_percentiles_ms(
    records: list[RequestRecord], percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
) -> dict[str, dict[str, float | None]]:
    """{metric: {"p50": ms, ...}} for every latency metric; what sweep tables and plots show whatever the flags."""
    samples = latency_samples_ms(records)
    return {
        name: {key: value for key, value in summarize_ms(values, percentiles).items() if key.startswith("p")}
        for name, values in samples.items()
    }
