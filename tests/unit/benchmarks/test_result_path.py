"""`--result-filename` as vLLM's bench takes it: joined to --result-dir, a path kept, an absolute one winning."""

from __future__ import annotations

import json
from pathlib import Path

from pagedserve.benchmarks.cli import main, result_path
from tests.unit.benchmarks.fake_openai_server import FakeOpenAIServer, FakeState
from tests.unit.benchmarks.test_serve_e2e import serve_args


def test_a_name_goes_into_the_result_dir():
    assert result_path("bench-results", "x.json") == Path("bench-results/x.json")


def test_a_path_in_the_filename_is_kept():
    assert result_path("bench-results", "runs/a/x.json") == Path("bench-results/runs/a/x.json")
    assert result_path("bench-results", "/tmp/x.json") == Path("/tmp/x.json")  # issue 40: was bench-results/x.json


def test_serve_writes_the_result_and_its_plots_where_told(tmp_path):
    """Issue 40: `bench serve --save-result --result-filename /tmp/x.json` wrote bench-results/x.json."""
    elsewhere = tmp_path / "elsewhere" / "x.json"
    args = ["--backend", "openai-completions", "--num-prompts", "2", "--random-input-len", "8",
            "--random-output-len", "2", "--ignore-eos", "--plot", "--result-filename", str(elsewhere)]
    with FakeOpenAIServer(FakeState()) as server:
        assert main(serve_args(server.base_url, tmp_path / "results", *args)) == 0
    assert json.loads(elsewhere.read_text())["runs"]
    assert any(p.name.startswith("x") and p.suffix == ".png" for p in elsewhere.parent.iterdir())
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
