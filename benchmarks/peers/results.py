"""Per-point result files merged into one sweep document per server and workload, with plots and a summary."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from pagedserve.benchmarks.cli_config import metrics_config
from pagedserve.benchmarks.metrics import compute_metrics
from pagedserve.benchmarks.peers.plan import SuitePlan
from pagedserve.benchmarks.plots import write_plots
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.report import load_result, run_records, save_result, sweep_table


def pool_rounds(results: list[dict]) -> dict:
    """One point measured in several rounds (the servers in turn, so that the machine's drift in speed falls on
    each alike) as one result: every round's requests over the rounds' summed duration, the metrics recomputed
    with the flags the rounds ran with."""
    if len(results) == 1:
        return results[0]
    pooled = copy.deepcopy(results[0])
    run = pooled["runs"][0]
    records: list[RequestRecord] = [record for result in results for record in run_records(result["runs"][0])]
    duration_s = sum(result["runs"][0]["metrics"]["duration_s"] for result in results)
    run["requests"] = [record.to_json() for record in records]
    flags = argparse.Namespace(**pooled["contract"]["args"])
    run["metrics"] = compute_metrics(records, duration_s, metrics_config(flags))
    run["rounds"] = len(results)
    return pooled


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
        points = [[load_result(path) for path in paths] for c in concurrencies
                  if (paths := plan.raw_paths(label, c, workload))]
        if not points:
            continue
        result = merge_points([pool_rounds(rounds) for rounds in points], plan)
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
