"""Server-side counters from a Prometheus /metrics endpoint: deltas over a run and the KV-usage peak during it."""

import asyncio
import contextlib
import re
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from pagedserve.benchmarks.client import HttpError, get

# Matched against metric names with ':' read as '_', so one pattern covers pagedserve_*, vllm:* and llamacpp:*.
# When several names match, the shortest wins (vllm:prefix_cache_hits_total over vllm:external_prefix_cache_...).
COUNTERS = {
    "prefix_cache_hits": re.compile(r"prefix_cache_hits(_total)?$"),
    "prefix_cache_queries": re.compile(r"prefix_cache_queries(_total)?$"),
    "num_preemptions": re.compile(r"(num_)?preemptions(_total)?$"),
    "spec_decode_num_drafts": re.compile(r"spec_decode_num_drafts(_total)?$"),
    "spec_decode_num_draft_tokens": re.compile(r"spec_decode_num_draft_tokens(_total)?$"),
    "spec_decode_num_accepted_tokens": re.compile(r"spec_decode_num_accepted_tokens(_total)?$"),
}
# one sample per draft position, in position order (pagedserve and vLLM expose position "0".."k-1" in order)
PER_POSITION = re.compile(r"spec_decode_num_accepted_tokens_per_pos(_total)?$")
GAUGES = {"kv_cache_usage": re.compile(r"(kv_cache_usage|gpu_cache_usage)(_ratio|_perc)?$")}

Samples = dict[str, list[float]]  # metric name -> one value per label set


def parse_prometheus_text(text: str) -> Samples:
    """Samples by their own names (`..._total`, `..._bucket`), in order. Raises ValueError on text that is not the
    Prometheus text format."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(float(sample.value))
    return samples


def find_metric(samples: Samples, pattern: re.Pattern) -> str | None:
    names = [name for name in samples if pattern.search(name.replace(":", "_"))]
    return min(names, key=lambda name: (len(name), name)) if names else None


def counter_deltas(before: Samples, after: Samples) -> tuple[dict[str, float], dict[str, str]]:
    """Increase of each watched counter (summed over label sets), and the server name each was read from."""
    deltas, names = {}, {}
    for key, pattern in COUNTERS.items():
        name = find_metric(after, pattern)
        if name is not None:
            deltas[key] = sum(after[name]) - sum(before.get(name, []))
            names[key] = name
    return deltas, names


def acceptance_by_position(before: Samples, after: Samples, num_drafts: float | None) -> list[float] | None:
    """Share of verified drafts whose token at each position was accepted over the run; None without speculation."""
    name = find_metric(after, PER_POSITION)
    if name is None or not num_drafts:
        return None
    old = before.get(name, [])
    return [(value - (old[i] if i < len(old) else 0.0)) / num_drafts for i, value in enumerate(after[name])]


def gauge_max(samples: Samples, key: str) -> tuple[float, str] | None:
    """Largest value of a watched gauge over its label sets (one per engine), and its server name."""
    name = find_metric(samples, GAUGES[key])
    return None if name is None else (max(samples[name]), name)


async def scrape(client: aiohttp.ClientSession, url: str) -> Samples | None:
    """None when the server has no usable /metrics."""
    try:
        response = await get(client, url)
    except HttpError:
        return None
    if response.status != 200:
        return None
    try:
        samples = parse_prometheus_text(response.text)
    except ValueError:
        return None
    return samples or None


@dataclass
class MetricsWatcher:
    """Scrapes before a run, polls the KV-usage gauge during it, and reports deltas after it."""

    client: aiohttp.ClientSession
    url: str
    poll_interval_s: float = 0.5
    before: Samples | None = None
    kv_usage_peak: float | None = None  # max over every scrape, including before and after
    kv_usage_name: str | None = None
    num_polls: int = 0
    _task: asyncio.Task | None = field(default=None, repr=False)

    async def start(self) -> bool:
        self.before = await scrape(self.client, self.url)
        if self.before is None:
            return False
        self._observe(self.before)
        self._task = asyncio.create_task(self._poll())
        return True

    async def stop(self) -> dict | None:
        if self._task is None:
            return None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        after = await scrape(self.client, self.url)
        if after is None:
            return None
        self._observe(after)
        return self._report(after)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            samples = await scrape(self.client, self.url)
            if samples is not None:
                self._observe(samples)

    def _observe(self, samples: Samples) -> None:
        self.num_polls += 1
        found = gauge_max(samples, "kv_cache_usage")
        if found is not None:
            value, self.kv_usage_name = found
            self.kv_usage_peak = value if self.kv_usage_peak is None else max(self.kv_usage_peak, value)

    def _report(self, after: Samples) -> dict:
        deltas, names = counter_deltas(self.before, after)
        hits, queries = deltas.get("prefix_cache_hits"), deltas.get("prefix_cache_queries")
        if self.kv_usage_name is not None:
            names["kv_cache_usage"] = self.kv_usage_name
        return {
            "metrics_url": self.url,
            **deltas,
            "prefix_cache_hit_rate": hits / queries if hits is not None and queries else None,
            "spec_decode_acceptance_by_position": acceptance_by_position(
                self.before, after, deltas.get("spec_decode_num_drafts")),
            "kv_cache_usage_peak": self.kv_usage_peak,
            "num_scrapes": self.num_polls,
            "server_metric_names": names,
        }
