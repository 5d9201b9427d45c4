"""The tenants benchmark's targets and its markdown table.

Targets (issue 41): B's share of the generated tokens while both tenants are backlogged >= 45%; A alone takes the
engine's whole rate (its tokens a second after B stopped over both tenants' while both were backlogged, >= 0.9:
the machine's drift within a run is about 10%); a priority-0 request's TTFT p50 during a priority-10 flood within
2x of its unloaded p50; and no request failed. A figure measured on nothing (no time both backlogged, no probe
under the flood) fails its target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagedserve.benchmarks.tenants.accounting import FairShareFigures, PriorityFigures

MIN_B_SHARE = 0.45
MIN_ALONE_RATIO = 0.9
MAX_TTFT_RATIO = 2.0


@dataclass(frozen=True)
class Target:
    name: str
    value: float
    bound: float
    at_least: bool  # the value must be >= bound (else <= bound)
    shown: str  # the value as the table prints it, with its parts

    @property
    def ok(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value >= self.bound if self.at_least else self.value <= self.bound


def targets(fair: FairShareFigures, prio: PriorityFigures, num_failed: int) -> list[Target]:
    return [
        Target("B's share of generated tokens while both backlogged", fair.b_share if fair.both_s else math.nan,
               MIN_B_SHARE, True, f"{fair.b_share:.1%} (A {fair.a_both:.0f}, B {fair.b_both:.0f} tokens over "
                                  f"{fair.both_s:.1f} s)"),
        Target("A's token rate after B stopped / both tenants' rate while both backlogged",
               fair.alone_ratio if fair.alone_s else math.nan, MIN_ALONE_RATIO, True,
               f"{fair.alone_ratio:.2f} ({fair.rate_alone:.1f} / {fair.rate_both:.1f} tok/s; A alone "
               f"{fair.alone_s:.1f} s)"),
        Target("priority-0 TTFT p50 during a priority-10 flood / unloaded", prio.ratio if prio.num_flood else math.nan,
               MAX_TTFT_RATIO, False,
               f"{prio.ratio:.2f} ({1000 * prio.flood_p50_s:.0f} / {1000 * prio.unloaded_p50_s:.0f} ms; "
               f"{prio.num_flood} of {prio.num_flood_sent} probes under the flood, {prio.num_unloaded} unloaded)"),
        Target("failed requests", float(num_failed), 0.0, False, str(num_failed)),
    ]


def table(rows: list[Target]) -> str:
    lines = ["| figure | measured | target | met |", "| --- | --- | --- | --- |"]
    for t in rows:
        bound = f"{'>=' if t.at_least else '<='} {t.bound:g}"
        lines.append(f"| {t.name} | {t.shown} | {bound} | {'yes' if t.ok else '**no**'} |")
    return "\n".join(lines)
