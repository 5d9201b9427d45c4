"""`--result-filename` as vLLM's bench takes it: joined to --result-dir, a path kept, an absolute one winning."""

from __future__ import annotations

from pathlib import Path

from pagedserve.benchmarks.cli import result_path


def test_a_name_goes_into_the_result_dir():
    assert result_path("bench-results", "x.json") == Path("bench-results/x.json")


def test_a_path_in_the_filename_is_kept():
    assert result_path("bench-results", "runs/a/x.json") == Path("bench-results/runs/a/x.json")
    assert result_path("bench-results", "/tmp/x.json") == Path("/tmp/x.json")  # issue 40: was bench-results/x.json
