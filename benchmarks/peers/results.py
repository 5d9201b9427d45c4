"""Per-point result files merged into one sweep document per server and workload, with plots and a summary."""

from __future__ import annotations

import copy
from pathlib import Path

from benchmarks.peers.plan import SuitePlan
from benchmarks.plots import write_plots
from benchmarks.report import load_result, save_result, sweep_table


def merge_points(results: list[dict], plan: SuitePlan) -> dict:
    """One document whose runs are the points in concurrency order, as a `--sweep max-concurrency=...` would give.

    The contract is the first point's, with the sweep, the base seed and the per-point prompt counts filled in.
    """
    runs = sorted((run for result in results for run in result["runs"]), key=lambda run: run["offered_load"] or 0)
    contract = copy.deepcopy(results[0]["contract"])
    concurrencies = [run["load"]["max_concurrency"] for run in runs]
    contract["sweep"] = "max-concurrency=" + ",".join(map(str, concurrencies))
    contract["seed"] = plan.seed
    contract["dataset"]["num_prompts"] = [plan.prompts_for(c) for c in concurrencies]
    contract["point_seeds"] = [run["seed"] for run in runs]
    contract["num_warmup_failures"] = sum(result["contract"]["num_warmup_failures"] for result in results)
    return {"schema_version": results[0]["schema_version"], "contract": contract, "runs": runs}


def write_server_results(plan: SuitePlan, label: str, concurrencies: tuple[int, ...], plot: bool = True) -> list[Path]:
    """Merge the raw per-point files of one server; returns the merged files (a workload with no points has none)."""
    written, summary = [], []
    for workload in plan.workloads:
        raw = [p for c in concurrencies if (p := plan.raw_path(label, c, workload)).is_file()]
        if not raw:
            continue
        result = merge_points([load_result(p) for p in raw], plan)
        path = plan.result_path(label, workload)
        save_result(result, path)
        written.append(path)
        summary += [f"## {label} / {workload}", sweep_table(result), ""]
        if plot:
            write_plots(result, path.parent, path.stem)
    summary_path = plan.out_dir / f"{label}-summary.txt"
    summary_path.write_text("\n".join(summary))
    print("\n".join(summary) + f"\nsummary: {summary_path}", flush=True)
    return written
