"""PNG plots from result documents: latency percentiles against offered load, and TTFT/ITL distributions."""

from pathlib import Path

import numpy as np

from benchmarks.metrics import LATENCY_METRICS, latency_percentiles_ms, latency_samples_ms
from benchmarks.report import run_records

_PERCENTILES = (50.0, 90.0, 99.0)
_STYLES = {"p50": "-", "p90": "--", "p99": ":"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _load_axis(result: dict) -> tuple[list[dict], list[float], str]:
    """Runs with a finite offered load, their x values and the axis title."""
    sweep = result["contract"].get("sweep") or "max-concurrency="
    runs = [run for run in result["runs"] if run["offered_load"] is not None]
    return runs, [run["offered_load"] for run in runs], sweep.partition("=")[0]


def plot_latency_vs_load(results: dict[str, dict], path: Path) -> Path:
    """p50/p90/p99 of each latency metric, plus output throughput, against the swept load; one colour per result."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for color, (name, result) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], results.items(), strict=False):
        runs, xs, x_title = _load_axis(result)
        pcts = [latency_percentiles_ms(run_records(run), _PERCENTILES) for run in runs]
        for ax, metric in zip(axes.flat, LATENCY_METRICS, strict=False):
            for key, style in _STYLES.items():
                ys = [np.nan if p[metric][key] is None else p[metric][key] for p in pcts]
                ax.plot(xs, ys, style, marker="o", color=color, label=f"{name} {key}")
            ax.set(title=f"{metric.upper()} (ms)", xlabel=x_title)
        axes.flat[4].plot(
            xs, [run["metrics"]["output_throughput_tok_s"] for run in runs], marker="o", color=color, label=name
        )
        axes.flat[5].plot(xs, [run["metrics"]["failed"] for run in runs], marker="o", color=color, label=name)
    axes.flat[4].set(title="output throughput (tok/s)", xlabel=x_title)
    axes.flat[5].set(title="failed requests", xlabel=x_title)
    all_xs = sorted({x for result in results.values() for x in _load_axis(result)[1]})
    for ax in axes.flat:
        ax.set_xscale("log", base=2)  # sweeps double the load per point
        ax.set_xticks(all_xs, [f"{x:g}" for x in all_xs])
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    axes.flat[4].legend(fontsize=7)
    return _save(fig, plt, path)


def plot_distributions(run: dict, path: Path) -> Path:
    """Histogram and CDF of TTFT and of ITL for one load point."""
    plt = _pyplot()
    samples = latency_samples_ms(run_records(run))
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for row, metric in zip(axes, ("ttft", "itl"), strict=True):
        values = np.sort(samples[metric])
        row[0].hist(values, bins=50)
        row[0].set(title=f"{metric.upper()} histogram", xlabel="ms", ylabel="count")
        row[1].step(values, np.arange(1, len(values) + 1) / max(len(values), 1), where="post")
        row[1].set(title=f"{metric.upper()} CDF", xlabel="ms", ylabel="fraction <= x")
        for ax in row:
            ax.grid(alpha=0.3)
    fig.suptitle(run["label"])
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """Distributions for every run; latency-vs-load when more than one point has a finite load."""
    paths = []
    for i, run in enumerate(result["runs"]):
        paths.append(plot_distributions(run, out_dir / f"{stem}_run{i}_distributions.png"))
    if len(_load_axis(result)[0]) > 1:
        paths.append(plot_latency_vs_load({result["contract"]["label"]: result}, out_dir / f"{stem}_vs_load.png"))
    return paths
