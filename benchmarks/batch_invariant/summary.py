"""The batch-invariance bench's table: per stream count and mode, output tok/s over all rounds (tokens summed over
durations summed) and the median of the rounds' ITL medians, with the invariant/default ratios."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MODES = ("default", "invariant")


@dataclass(frozen=True)
class Cell:
    """One (stream count, mode) over its rounds."""

    output_tok_s: float
    itl_p50_ms: float
    rounds_tok_s: tuple[float, ...]


def cell(rounds: list[dict]) -> Cell:
    """Rounds' metrics (pagedserve.benchmarks.metrics.compute_metrics documents) -> their Cell."""
    tokens = sum(m["total_output_tokens"] for m in rounds)
    seconds = sum(m["duration_s"] for m in rounds)
    medians = [m["median_itl_ms"] for m in rounds if m.get("median_itl_ms") is not None]
    return Cell(tokens / seconds if seconds else 0.0, statistics.median(medians) if medians else float("nan"),
                tuple(round(m["output_throughput_tok_s"], 1) for m in rounds))


def table(cells: dict[int, dict[str, Cell]]) -> str:
    """A markdown table: one line per stream count, both modes side by side and their ratios."""
    lines = ["| streams | default tok/s | invariant tok/s | tok/s ratio | default ITL p50 ms | invariant ITL p50 ms "
             "| ITL ratio |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for streams, modes in sorted(cells.items()):
        base, inv = modes["default"], modes["invariant"]
        tok_ratio = inv.output_tok_s / base.output_tok_s if base.output_tok_s else float("nan")
        itl_ratio = inv.itl_p50_ms / base.itl_p50_ms if base.itl_p50_ms else float("nan")
        lines.append(f"| {streams} | {base.output_tok_s:.1f} | {inv.output_tok_s:.1f} | {tok_ratio:.2f} | "
                     f"{base.itl_p50_ms:.1f} | {inv.itl_p50_ms:.1f} | {itl_ratio:.2f} |")
    return "\n".join(lines)
