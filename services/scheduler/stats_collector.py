"""Prometheus exposition of SchedulerStats: one metric per field, named by the field's metadata."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pagedserve.shared.scheduler_stats import STATS_FIELDS, MetricSpec, SchedulerStats


class StatsCollector:
    """A prometheus_client collector: reads a fresh snapshot at each scrape (nothing is kept between scrapes).

    `source` returns None while there is nothing to report (the worker has not described itself yet); every
    sample carries `model_name`, plus the label of a dict field's keys."""

    def __init__(self, source: Callable[[], tuple[SchedulerStats, str] | None]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        snapshot = self.source()
        if snapshot is None:
            return
        stats, model_name = snapshot
        for f in STATS_FIELDS:
            spec: MetricSpec = f.metadata["metric"]
            labels = ["model_name"] + ([spec.label] if spec.label else [])
            family_type = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            family = family_type(spec.name, spec.documentation, labels=labels)
            value = getattr(stats, f.name)
            if spec.label:
                for key, count in sorted(value.items()):
                    family.add_metric([model_name, key], count)
            else:
                family.add_metric([model_name], value / 1e9 if f.name.endswith("_ns_total") else float(value))
            yield family
