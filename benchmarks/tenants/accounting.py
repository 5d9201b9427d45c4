"""The tenants benchmark's accounting, from what the clients observed (no clock of its own, no server state).

Times are seconds from the run's start: a request was sent at `send_offset_s`, its chunks arrived
`chunk_times_s` after that. A tenant is *backlogged* while one of its requests waits for its first token (sent,
no token yet): it asked for more than it is being served. Generated tokens are counted where they arrived: each
chunk carries its request's `usage` count spread evenly over its chunks (one a chunk when the server streams a
token a chunk), so the tokens of every window add up to the requests' usage.

Contracts:
- `backlog` is the union of `[send, first token)` over a tenant's requests (a failed request without a token:
  until it ended); intervals are merged, sorted, disjoint.
- `fair_share` counts both tenants' tokens over the time both were backlogged after the settling time and before B
  stopped; A alone is from B's last token to A's stop, where A was backlogged.
- `priority` compares medians of first-token times; a probe counts as under the flood only if it was sent while
  the flood's tenant was backlogged.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from pagedserve.benchmarks.records import RequestRecord

Interval = tuple[float, float]
TENANT_TOKENS = "pagedserve_gateway_tenant_tokens_total"


def merge(spans: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-empty intervals covering the same time as `spans`."""
    merged: list[Interval] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """The time covered by both (each argument merged)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(spans: Iterable[Interval]) -> float:
    return sum(end - start for start, end in spans)


def backlog(records: Iterable[RequestRecord]) -> list[Interval]:
    """Where the tenant had a request waiting for its first token."""
    spans = []
    for r in records:
        waited = r.ttft_s if r.ttft_s is not None else (r.e2el_s or 0.0)
        spans.append((r.send_offset_s, r.send_offset_s + waited))
    return merge(spans)


def token_arrivals(record: RequestRecord) -> list[Interval]:
    """(arrival time, tokens) of each text chunk of the request."""
    times = record.chunk_times_s
    if not times:
        return []
    per_chunk = (record.num_output_tokens or len(times)) / len(times)
    return [(record.send_offset_s + t, per_chunk) for t in times]


def inside(t: float, spans: Sequence[Interval]) -> bool:
    """Whether `t` lies in one of `spans` (merged intervals; an end is exclusive)."""
    i = bisect.bisect_right(spans, (t, math.inf)) - 1
    return i >= 0 and spans[i][0] <= t < spans[i][1]


def tokens_within(records: Iterable[RequestRecord], spans: Sequence[Interval]) -> float:
    """Generated tokens that arrived inside `spans` (merged intervals)."""
    return sum(n for r in records for t, n in token_arrivals(r) if inside(t, spans))


def last_token_s(records: Iterable[RequestRecord]) -> float:
    """When the last of these requests' tokens arrived (0 without any)."""
    return max((t for r in records for t, _ in token_arrivals(r)), default=0.0)


@dataclass(frozen=True)
class FairShareFigures:
    both_s: float  # how long both tenants were backlogged (after settling, before B stopped)
    a_both: float  # A's generated tokens then
    b_both: float  # B's
    alone_s: float  # from B's last token to A's stop, while A was backlogged
    a_alone: float  # A's tokens then

    @property
    def b_share(self) -> float:
        total = self.a_both + self.b_both
        return self.b_both / total if total else 0.0

    @property
    def rate_both(self) -> float:
        """Both tenants' tokens a second while both were backlogged: the engine's rate under the mix."""
        return (self.a_both + self.b_both) / self.both_s if self.both_s else 0.0

    @property
    def rate_alone(self) -> float:
        return self.a_alone / self.alone_s if self.alone_s else 0.0

    @property
    def alone_ratio(self) -> float:
        """A's rate alone over the engine's rate under the mix: 1 when A took all that B left."""
        return self.rate_alone / self.rate_both if self.rate_both else 0.0


def fair_share(a: Sequence[RequestRecord], b: Sequence[RequestRecord], settle_s: float, b_stop_s: float,
               a_stop_s: float) -> FairShareFigures:
    both = intersect(intersect(backlog(a), backlog(b)), [(settle_s, b_stop_s)])
    alone = intersect(backlog(a), [(last_token_s(b), a_stop_s)])
    return FairShareFigures(length(both), tokens_within(a, both), tokens_within(b, both), length(alone),
                            tokens_within(a, alone))


@dataclass(frozen=True)
class PriorityFigures:
    unloaded_p50_s: float
    flood_p50_s: float
    num_unloaded: int  # probes with a first token, nothing else running
    num_flood: int  # probes with a first token, sent while the flood was backlogged
    num_flood_sent: int  # every probe sent during the flood phases

    @property
    def ratio(self) -> float:
        return self.flood_p50_s / self.unloaded_p50_s if self.unloaded_p50_s else float("inf")


def ttft_p50(records: Iterable[RequestRecord]) -> float:
    ttfts = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    return statistics.median(ttfts) if ttfts else float("nan")


def priority(unloaded: Sequence[RequestRecord], flood_probes: Sequence[RequestRecord],
             flood: Sequence[RequestRecord]) -> PriorityFigures:
    flooded = backlog(flood)
    under = [r for r in flood_probes if inside(r.send_offset_s, flooded)]
    return PriorityFigures(ttft_p50(unloaded), ttft_p50(under), sum(r.ttft_s is not None for r in unloaded),
                           sum(r.ttft_s is not None for r in under), len(flood_probes))


def tenant_generated(metrics_text: str) -> dict[str, float]:
    """Generated tokens by tenant from a gateway's /metrics (`pagedserve_gateway_tenant_tokens_total`)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == TENANT_TOKENS and sample.labels.get("kind") == "generated":
                out[sample.labels["tenant"]] = out.get(sample.labels["tenant"], 0.0) + sample.value
    return out
