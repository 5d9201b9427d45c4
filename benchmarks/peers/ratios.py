"""The comparison table of `make bench-peers`: pagedserve / peer at each concurrency of both workloads."""

from __future__ import annotations

from pathlib import Path

from pagedserve.benchmarks.peers.servers import LLAMA_THREADS_PREFIX
from pagedserve.benchmarks.plots import plot_latency_vs_load
from pagedserve.benchmarks.report import load_result

# (metrics key, row title); throughput: higher is better, latencies: lower is better
METRICS = (
    ("output_throughput_tok_s", "output tok/s"),
    ("median_ttft_ms", "median TTFT ms"),
    ("median_itl_ms", "median ITL ms"),
    ("median_tpot_ms", "median TPOT ms"),
)
NOTE = (
    "ratio = pagedserve / peer. Output throughput: > 1 favours pagedserve. TTFT, ITL, TPOT: < 1 favours pagedserve.\n"
    "Every server saw the same prompts at each point (same tokenizer, seed per concurrency); EOS suppressed."
)


def runs_by_concurrency(result: dict) -> dict[int, dict]:
    return {run["load"]["max_concurrency"]: run for run in result["runs"]}


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}"


def workload_table(workload: str, results: dict[str, dict]) -> list[str]:
    """Rows per (concurrency, metric); columns: pagedserve, then each peer's value and pagedserve/peer."""
    base, peers = results["pagedserve"], [label for label in results if label != "pagedserve"]
    by_label = {label: runs_by_concurrency(result) for label, result in results.items()}
    header = f"{'conc':>5}  {'metric':<16}{'pagedserve':>12}"
    widths = {label: (max(14, len(label) + 2), max(17, len(label) + 5)) for label in peers}
    header += "".join(f"{label:>{widths[label][0]}}{'ps/' + label:>{widths[label][1]}}" for label in peers)
    lines = [f"== {workload} ==", header]
    for concurrency, run in runs_by_concurrency(base).items():
        for key, title in METRICS:
            ours = run["metrics"].get(key)
            row = f"{concurrency:>5}  {title:<16}{_cell(ours):>12}"
            for label in peers:
                theirs = (by_label[label].get(concurrency) or {}).get("metrics", {}).get(key)
                row += f"{_cell(theirs):>{widths[label][0]}}{_ratio(ours, theirs):>{widths[label][1]}}"
            lines.append(row)
    return lines + _health_notes(results)


def _health_notes(results: dict[str, dict]) -> list[str]:
    """Points where requests failed or stopped before max_tokens: their numbers are not comparable."""
    notes = []
    for label, result in results.items():
        for run in result["runs"]:
            m = run["metrics"]
            if m["failed"] or m["num_short_outputs"]:
                notes.append(f"  note: {label} at concurrency {run['load']['max_concurrency']}: {m['failed']} failed,"
                             f" {m['num_short_outputs']} short of max_tokens")  # fmt: skip
    return notes


BEST_LLAMA = "llama.cpp-best"


def _better(run: dict, other: dict) -> bool:
    """At one stream the lower median ITL wins (the single-user figure); under load the higher output tok/s."""
    ours, theirs = run["metrics"], other["metrics"]
    if run["load"]["max_concurrency"] == 1:
        return (ours.get("median_itl_ms") or float("inf")) < (theirs.get("median_itl_ms") or float("inf"))
    return (ours.get("output_throughput_tok_s") or 0) > (theirs.get("output_throughput_tok_s") or 0)


def best_llama(results: dict[str, dict]) -> tuple[dict, list[str]] | None:
    """With llama.cpp run at several thread counts: per concurrency the best count's run, and which it was."""
    sweep = {label: result for label, result in results.items() if label.startswith(LLAMA_THREADS_PREFIX)}
    if len(sweep) < 2:
        return None
    best: dict[int, tuple[str, dict]] = {}
    for label, result in sweep.items():
        for concurrency, run in runs_by_concurrency(result).items():
            if concurrency not in best or _better(run, best[concurrency][1]):
                best[concurrency] = (label, run)
    chosen = [f"  {BEST_LLAMA} at concurrency {c}: {label}" for c, (label, _) in sorted(best.items())]
    return {"runs": [run for _, (_, run) in sorted(best.items())]}, chosen


def comparison(plan_out_dir: Path, labels: list[str], workloads: tuple[str, ...], plot: bool = True) -> str:
    """The whole table (both workloads); also draws <out>/peers-<workload>_vs_load.png with every server."""
    sections = [NOTE]
    for workload in workloads:
        paths = {label: plan_out_dir / f"{label}-{workload}.json" for label in labels}
        results = {label: load_result(path) for label, path in paths.items() if path.is_file()}
        if "pagedserve" not in results or len(results) < 2:
            sections.append(
                f"== {workload} ==\n  (needs pagedserve and at least one peer result: have {list(results)})"
            )
            continue
        best = best_llama(results)
        chosen = []
        if best is not None:
            results[BEST_LLAMA], chosen = best
        sections.append("\n".join(workload_table(workload, results) + chosen))
        results.pop(BEST_LLAMA, None)
        if plot:
            plot_latency_vs_load(results, plan_out_dir / f"peers-{workload}_vs_load.png")
    return "\n\n".join(sections)
