"""Side-by-side metrics of result files, runs matched by load point, with ratios against the first file."""

import json
from pathlib import Path

from pagedserve.benchmarks.report import load_result

_SERVER_KEYS = ("prefix_cache_hit_rate", "num_preemptions", "kv_cache_usage_peak")
_SKIPPED = ("num_requests", "failures")
_CONTRACT_KEYS = ("model", "endpoint_type", "dataset", "seed", "sampling", "eos_suppression", "sweep")


def result_names(paths: list[str], results: list[dict]) -> list[str]:
    """Each file's label, or its file name when labels are missing or collide."""
    labels = [result["contract"].get("label") for result in results]
    if None in labels or len(set(labels)) < len(labels):
        return [Path(path).stem for path in paths]
    return labels


def matched_runs(results: list[dict]) -> list[tuple[str, list[dict | None]]]:
    """(load point, each file's run or None) in the first file's order; single runs always match."""
    if all(len(result["runs"]) == 1 for result in results):
        return [(results[0]["runs"][0]["label"], [result["runs"][0] for result in results])]
    by_label = [{run["label"]: run for run in result["runs"]} for result in results]
    labels = [run["label"] for run in results[0]["runs"]]
    return [(label, [runs.get(label) for runs in by_label]) for label in labels]


def contract_differences(names: list[str], results: list[dict]) -> list[str]:
    """Contract fields that differ between files: numbers compared across them may not be comparable."""
    lines = []
    for key in _CONTRACT_KEYS:
        values = [json.dumps(result["contract"].get(key), sort_keys=True) for result in results]
        if len(set(values)) > 1:
            lines.append(
                f"warning: {key} differs: " + "; ".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
            )
    return lines


def _values(run: dict | None) -> dict:
    if run is None:
        return {}
    values = {k: v for k, v in run["metrics"].items() if k not in _SKIPPED}
    server = run.get("server_metrics") or {}
    return values | {k: server.get(k) for k in _SERVER_KEYS if k in server}


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _ratio(a, b) -> str:
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == 0:
        return "-"
    return f"{b / a:.3f}"


def compare_table(names: list[str], results: list[dict]) -> str:
    header = f"{'metric':<34}{names[0]:>14}" + "".join(f"{name:>14}{name + '/' + names[0]:>16}" for name in names[1:])
    lines = []
    for label, runs in matched_runs(results):
        lines += ["", f"== {label} ==", header]
        values = [_values(run) for run in runs]
        for key in values[0]:
            row = f"{key:<34}{_cell(values[0][key]):>14}"
            for other in values[1:]:
                row += f"{_cell(other.get(key)):>14}{_ratio(values[0][key], other.get(key)):>16}"
            lines.append(row)
    return "\n".join(lines[1:])


def run_compare(paths: list[str], plot_path: str | None = None) -> str:
    if len(paths) < 2:
        raise ValueError("compare needs at least two result files")
    results = [load_result(path) for path in paths]
    names = result_names(paths, results)
    if plot_path:
        from pagedserve.benchmarks.plots import plot_latency_vs_load

        plot_latency_vs_load(dict(zip(names, results, strict=True)), Path(plot_path))
    return "\n".join([*contract_differences(names, results), compare_table(names, results)])
