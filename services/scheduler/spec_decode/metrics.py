"""Prometheus exposition of SpecDecodeCounters under vLLM's names with our prefix.

The position label is bounded by MAX_SPECULATIVE_TOKENS (the config refuses larger k).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from pagedserve.services.scheduler.spec_decode.counters import SpecDecodeCounters

SpecSource = Callable[[], tuple[SpecDecodeCounters, str] | None]


class SpecDecodeCollector:
    """Reads the live scheduler's counters at each scrape; nothing while speculation is off or before a worker."""

    def __init__(self, source: SpecSource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        snapshot = self.source()
        if snapshot is None:
            return
        counters, model_name = snapshot
        for name, documentation, value in (
                ("num_drafts", "draft runs verified (a request's drafts in one step)", counters.num_drafts),
                ("num_draft_tokens", "draft tokens proposed and verified", counters.num_draft_tokens),
                ("num_accepted_tokens", "draft tokens accepted", counters.num_accepted_tokens)):
            family = CounterMetricFamily(f"pagedserve_spec_decode_{name}", documentation, labels=["model_name"])
            family.add_metric([model_name], value)
            yield family
        family = CounterMetricFamily("pagedserve_spec_decode_num_accepted_tokens_per_pos",
                                     "draft tokens accepted at each draft position (0: the first draft token)",
                                     labels=["model_name", "position"])
        for position, count in enumerate(counters.num_accepted_per_position):
            family.add_metric([model_name, str(position)], count)
        yield family
