"""Plots a person wants to look at: titled with model, dataset and lengths, server and date; p50/p99 marked;
distinct colours per percentile and per server; a log load axis; integer counts; one readable legend; file names
that carry the load point."""

from dataclasses import asdict

import numpy as np
import pytest
from matplotlib.colors import to_hex

from pagedserve.benchmarks import plots
from pagedserve.benchmarks.datasets import DatasetConfig
from pagedserve.benchmarks.load import LoadPoint
from pagedserve.benchmarks.metrics import MetricsConfig, compute_metrics
from pagedserve.benchmarks.records import RequestRecord
from pagedserve.benchmarks.report import run_to_dict
from pagedserve.benchmarks.runner import RunResult

CONCURRENCIES = (1, 4, 16)


def make_result(label: str, scale: float, sweep: str | None = "max-concurrency=1,4,16") -> dict:
    rng = np.random.default_rng(0)
    runs = []
    for i, concurrency in enumerate(CONCURRENCIES):
        records = []
        for j in range(12):
            gaps = rng.uniform(0.01, 0.03, size=8) * scale * concurrency
            times = list(np.cumsum(np.concatenate([[0.05 * scale], gaps])))
            records.append(RequestRecord(j, 9, 64, 0.0, times, times[-1], 9, "usage", "length"))
        records[-1] = RequestRecord(11, 9, 64, 0.0, error="http_500") if concurrency == 16 else records[-1]
        point = LoadPoint(max_concurrency=concurrency)
        metrics = compute_metrics(records, 2.0, MetricsConfig())
        runs.append(run_to_dict(RunResult(point, i, "2026-12-03T10:00:00+00:00", metrics, None, records), sweep))
    dataset = asdict(DatasetConfig("random", 12, random_input_len=256, random_output_len=64))
    contract = {"label": label, "model": "SmolLM2-135M-Instruct", "dataset": dataset, "sweep": sweep,
                "server": {"version": "0.1.0"}, "sampling": {"ignore_eos": True},
                "started_at": "2026-12-03T10:00:00+00:00"}
    return {"contract": contract, "runs": runs}


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw, kept open for inspection instead of written."""
    kept = {}

    def keep(fig, plt, path):
        kept[path.name] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    yield kept
    import matplotlib.pyplot as plt

    for fig in kept.values():
        plt.close(fig)


def test_files_are_named_by_load_point(tmp_path, figures):
    paths = plots.write_plots(make_result("pagedserve", 1.0), tmp_path, "run")
    assert [path.name for path in paths] == ["run_concurrency1_distributions.png", "run_concurrency4_distributions.png",
                                             "run_concurrency16_distributions.png", "run_vs_load.png"]
    rate = {"load": {"request_rate": 4.0, "max_concurrency": None}}
    assert plots.point_slug(rate) == "rate4" and plots.point_slug({"load": {}}) == "unbounded"


def test_distribution_title_marks_and_integer_counts(tmp_path, figures):
    result = make_result("pagedserve", 1.0)
    plots.plot_distributions(result, result["runs"][2], tmp_path / "d.png")
    fig = figures["d.png"]
    title = fig._suptitle.get_text()
    for part in ("max concurrency 16", "11 of 12 requests succeeded", "SmolLM2-135M-Instruct",
                 "random, 256 in / 64 out tokens", "pagedserve 0.1.0", "EOS suppressed", "2026-12-03"):
        assert part in title, part
    for ax in fig.axes:
        labels = [text.get_text() for text in ax.get_legend().get_texts()]
        assert [label.split()[0] for label in labels] == ["p50", "p99"] and all("ms" in label for label in labels)
        lines = {line.get_label().split()[0]: to_hex(line.get_color()) for line in ax.get_lines()
                 if line.get_label().startswith("p")}
        assert lines["p50"] != lines["p99"]
    for hist in (fig.axes[0], fig.axes[2]):
        ticks = [t for t in hist.get_yticks() if hist.get_ylim()[0] <= t <= hist.get_ylim()[1]]
        assert all(float(t).is_integer() for t in ticks), ticks


def test_sweep_colours_axis_legend_and_failures(tmp_path, figures):
    results = {"pagedserve": make_result("pagedserve", 1.0), "llama.cpp": make_result("llama.cpp", 2.0)}
    plots.plot_latency_vs_load(results, tmp_path / "s.png")
    fig = figures["s.png"]
    title = fig._suptitle.get_text()
    assert "pagedserve, llama.cpp" in title and "max concurrency" in title and "256 in / 64 out" in title
    assert "2026-12-03" in title
    ttft = fig.axes[0]
    colours = {line.get_label(): to_hex(line.get_color()) for line in ttft.get_lines()}
    assert len(colours) == 6 and len(set(colours.values())) == 6  # every server x percentile has its own colour
    for ax in fig.axes[:6]:
        assert ax.get_xscale() == "log"
        assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1", "4", "16"]
    (legend,) = fig.legends  # one legend for the figure, not one per panel
    assert len(legend.get_texts()) == 6 and legend.get_texts()[0].get_fontsize() >= 10
    assert all(ax.get_legend() is None for ax in fig.axes)
    failed = fig.axes[5]
    assert failed.get_ylim()[0] == 0 and failed.get_ylim()[1] >= 1
    assert all(float(t).is_integer() for t in failed.get_yticks())


def test_no_failures_axis_is_not_a_sliver_around_zero(tmp_path, figures):
    result = make_result("pagedserve", 1.0)
    for run in result["runs"]:
        run["metrics"]["failed"] = 0
    plots.plot_latency_vs_load({"pagedserve": result}, tmp_path / "s.png")
    low, high = figures["s.png"].axes[5].get_ylim()
    assert low == 0 and high >= 1
