"""The device script's plumbing on CPU: `python -m pagedserve.benchmarks.device --cpu-dry-run` runs every section at toy
sizes
in under 90 s and each reports (what cannot run on CPU says `needs cuda`)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pagedserve.benchmarks.device.check import _sections

REPO_ROOT = Path(__file__).resolve().parents[3]
LIMIT_S = 90


def test_cpu_dry_run_reports_every_section_in_time(tmp_path):
    results_path = tmp_path / "results.json"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pagedserve.benchmarks.device", "--cpu-dry-run", "--results",
                           str(results_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=LIMIT_S + 30)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert elapsed < LIMIT_S, f"dry run took {elapsed:.0f} s"
    results = json.loads(results_path.read_text())
    assert results["mode"] == "cpu-dry-run"
    sections = results["sections"]
    assert list(sections) == [name for name, *_ in _sections()]
    for name, record in sections.items():
        assert record["status"] == "ok", (name, record)
        assert record["rows"] or name == "targets", f"{name} measured nothing"
    attention = sections["attention kernels"]["rows"]
    assert {(r["kind"], r["batch"]) for r in attention} == {("decode", 1), ("decode", 2), ("prefill", 1)}
    assert all(r["err_ok"] and r["triton_ms"] > 0 and r["flash_ms"] > 0 for r in attention)
    assert all(r["cudnn_how"].startswith("needs cuda") for r in attention)
    assert all(r["buffer_sets"] >= 4 for r in attention)
    assert any("tok_s" in r and r["tok_s"] > 0 for r in sections["engine"]["rows"])
    assert [r["batch"] for r in sections["transformers baseline"]["rows"]] == [1, 2]
    assert len(results["targets"]) == 8
    assert all(t["verdict"] == "DRY RUN" or t["verdict"].startswith("NOT MEASURED") for t in results["targets"])
