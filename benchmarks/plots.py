"""PNG plots from result documents: latency percentiles against offered load, and TTFT/ITL distributions.

Every figure says what it measured in its title (model, dataset and lengths, server, date). Sweeps use a log
concurrency (or rate) axis, one colour family per server and one shade per percentile, and a single legend below
the panels; distributions mark p50 and p99. File names carry the load point (`_concurrency16_`).
"""

from pathlib import Path

import numpy as np

from pagedserve.benchmarks.metrics import LATENCY_METRICS, latency_percentiles_ms, latency_samples_ms
from pagedserve.benchmarks.report import run_records

_PERCENTILES = (50.0, 90.0, 99.0)
_STYLES = {"p50": ("-", "o"), "p90": ("--", "s"), "p99": (":", "^")}  # line style, marker
_SHADES = {"p50": 0.95, "p90": 0.72, "p99": 0.5}  # darkest for the median
_FAMILIES = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys")  # one per server
_MARKS = {"p50": "tab:green", "p99": "tab:red"}  # distribution plots: p50 and p99 lines
_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
_AXES = {"max-concurrency": "max concurrency (requests in flight)", "request-rate": "request rate (requests/s)"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    return plt


def _load_axis(result: dict) -> tuple[list[dict], list[float], str]:
    """Runs with a finite offered load, their x values and the sweep key."""
    sweep = result["contract"].get("sweep") or "max-concurrency="
    runs = [run for run in result["runs"] if run["offered_load"] is not None]
    return runs, [run["offered_load"] for run in runs], sweep.partition("=")[0]


def _lengths(dataset: dict) -> str:
    name = dataset.get("name", "?")
    if name == "random":
        spread = f" ±{dataset['random_range_ratio']:.0%}" if dataset.get("random_range_ratio") else ""
        return f"random, {dataset['random_input_len']} in / {dataset['random_output_len']} out tokens{spread}"
    if name == "shared-prefix":
        return (f"shared-prefix, {dataset['num_groups']} prompts of {dataset['shared_prefix_len']} + "
                f"{dataset['shared_prefix_question_len']} in / {dataset['shared_prefix_output_len']} out tokens")
    return f"{name} ({Path(dataset.get('path') or '').name})"


def describe(result: dict, with_server: bool = True) -> str:
    """`model · dataset and lengths · server version · date` of a result, for figure titles."""
    contract = result["contract"]
    parts = [Path(str(contract.get("model") or "?")).name, _lengths(contract.get("dataset") or {})]
    if with_server:
        version = (contract.get("server") or {}).get("version")
        parts.append(f"{contract.get('label', '?')}{f' {version}' if version else ''}")
    eos = "EOS suppressed" if (contract.get("sampling") or {}).get("ignore_eos") else "EOS allowed"
    return " · ".join([*parts, eos, str(contract.get("started_at") or "")[:10]])


def point_slug(run: dict) -> str:
    """The load point in a file name: concurrency16, rate4, rate4-concurrency16, or unbounded."""
    load = run.get("load") or {}
    parts = ([f"rate{load['request_rate']:g}"] if load.get("request_rate") else []) + \
        ([f"concurrency{load['max_concurrency']}"] if load.get("max_concurrency") else [])
    return "-".join(parts) or "unbounded"


def _point_words(run: dict) -> str:
    load = run.get("load") or {}
    parts = ([f"{load['request_rate']:g} requests/s"] if load.get("request_rate") else []) + \
        ([f"max concurrency {load['max_concurrency']}"] if load.get("max_concurrency") else [])
    return ", ".join(parts) or "all requests at once"


def _colour(plt, server_index: int, key: str):
    return plt.get_cmap(_FAMILIES[server_index % len(_FAMILIES)])(_SHADES[key])


def plot_latency_vs_load(results: dict[str, dict], path: Path) -> Path:
    """p50/p90/p99 of each latency metric, output throughput and failures against the swept load."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator, NullLocator

    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5))
    handles = {}
    for index, (name, result) in enumerate(results.items()):
        runs, xs, _ = _load_axis(result)
        pcts = [latency_percentiles_ms(run_records(run), _PERCENTILES) for run in runs]
        for ax, metric in zip(axes.flat, LATENCY_METRICS, strict=False):
            for key, (style, marker) in _STYLES.items():
                ys = [np.nan if p[metric][key] is None else p[metric][key] for p in pcts]
                (line,) = ax.plot(xs, ys, style, marker=marker, color=_colour(plt, index, key), linewidth=2,
                                  label=f"{name} {key}")
                handles.setdefault(f"{name} {key}", line)
        colour = _colour(plt, index, "p50")
        axes.flat[4].plot(xs, [run["metrics"]["output_throughput_tok_s"] for run in runs], marker="o",
                          color=colour, linewidth=2)
        axes.flat[5].plot(xs, [run["metrics"]["failed"] for run in runs], marker="o", color=colour, linewidth=2)
    first = next(iter(results.values()))
    x_title = _AXES.get(_load_axis(first)[2], _load_axis(first)[2])
    for ax, metric in zip(axes.flat, LATENCY_METRICS, strict=False):
        ax.set(title=f"{_NAMES[metric]} (ms)", ylabel="ms")
    axes.flat[4].set(title="output throughput (tokens/s)", ylabel="tokens/s")
    most_failed = max((run["metrics"]["failed"] for r in results.values() for run in _load_axis(r)[0]), default=0)
    axes.flat[5].set(title="failed requests", ylabel="requests", ylim=(0, max(1, most_failed) * 1.15))
    axes.flat[5].yaxis.set_major_locator(MaxNLocator(integer=True))
    all_xs = sorted({x for result in results.values() for x in _load_axis(result)[1]})
    for ax in axes.flat:
        ax.set_xscale("log", base=2)  # sweeps double the load per point
        ax.set_xticks(all_xs, [f"{x:g}" for x in all_xs])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(x_title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 6), fontsize=11,
               frameon=False, title="server and percentile (throughput and failures: p50 colour)")
    servers = ", ".join(results)
    fig.suptitle(f"Latency and throughput vs {x_title}: {servers}\n{describe(first, with_server=len(results) == 1)}",
                 fontsize=13)
    fig.tight_layout(rect=(0, 0.1 if len(handles) > 6 else 0.07, 1, 1))
    return _save(fig, plt, path)


def plot_distributions(result: dict, run: dict, path: Path) -> Path:
    """Histogram and CDF of TTFT and of ITL at one load point, p50 and p99 marked."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    samples = latency_samples_ms(run_records(run))
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for row, metric in zip(axes, ("ttft", "itl"), strict=True):
        values = np.sort(samples[metric])
        marks = {key: float(np.percentile(values, float(key[1:]))) for key in _MARKS} if len(values) else {}
        row[0].hist(values, bins=min(50, max(10, len(values) // 4)), color="tab:blue", alpha=0.75)
        row[0].set(title=f"{_NAMES[metric]}: how many took how long ({len(values)} samples)", xlabel="ms",
                   ylabel="count")
        row[0].yaxis.set_major_locator(MaxNLocator(integer=True))
        row[1].step(values, np.arange(1, len(values) + 1) / max(len(values), 1), where="post", color="tab:blue",
                    linewidth=2)
        row[1].set(title=f"{_NAMES[metric]}: cumulative", xlabel="ms", ylabel="fraction of samples <= x",
                   ylim=(0, 1.02))
        for ax in row:
            for key, value in marks.items():
                ax.axvline(value, color=_MARKS[key], linestyle="--", linewidth=2, label=f"{key} {value:.1f} ms")
            if marks:
                ax.legend(fontsize=11, loc="best")
            ax.grid(alpha=0.3)
    m = run["metrics"]
    fig.suptitle(f"TTFT and ITL at {_point_words(run)}: {m['completed']} of {m['completed'] + m['failed']} requests "
                 f"succeeded, {m['output_throughput_tok_s']:.1f} output tokens/s\n{describe(result)}", fontsize=13)
    fig.tight_layout()
    return _save(fig, plt, path)


def _save(fig, plt, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(result: dict, out_dir: Path, stem: str) -> list[Path]:
    """Distributions for every run (named by its load point); latency-vs-load when more than one point has a
    finite load."""
    paths = []
    for run in result["runs"]:
        paths.append(plot_distributions(result, run, out_dir / f"{stem}_{point_slug(run)}_distributions.png"))
    if len(_load_axis(result)[0]) > 1:
        paths.append(plot_latency_vs_load({result["contract"]["label"]: result}, out_dir / f"{stem}_vs_load.png"))
    return paths
