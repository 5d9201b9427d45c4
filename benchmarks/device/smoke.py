"""Section: a small pytest selection run on the section's device (compiled Triton on CUDA; interpreted in a dry
run), in a fresh process (Triton picks interpreter or compiler at import), within the section's box."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pagedserve.benchmarks.device.context import Section

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
CUDA_SELECTION = [
    ["tests/kernels/test_fused_layer_kernels.py", "tests/kernels/test_cache_write.py",
     "tests/kernels/test_triton_backend.py", "tests/kernels/test_weight_only_linear.py"],
    ["tests/unit/gpu_worker/test_logits_vs_transformers.py", "-k", "triton and llama and not llama3"],
]
GRAPH_TESTS = "tests/unit/gpu_worker/test_*graph*.py"  # the CUDA graph runner's tests, where this build has them
# One process, a few cases: a pytest start is most of it on CPU.
DRY_RUN_SELECTION = [["tests/kernels/test_fused_layer_kernels.py", "-k", "dtype0 and (1-64 or 1-96)"]]
_SUMMARY = re.compile(r"\d+ (passed|failed|error)")


def selection(dry_run: bool) -> list[list[str]]:
    if dry_run:
        return DRY_RUN_SELECTION
    graph_tests = sorted(str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob(GRAPH_TESTS))
    return CUDA_SELECTION + ([graph_tests] if graph_tests else [])


def run_pytest(args: list[str], timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    try:
        done = subprocess.run(cmd, cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True,
                              timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        return {"tests": " ".join(args), "returncode": None, "summary": f"timed out after {timeout_s:.0f} s"}
    lines = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != 0:
        print("\n".join(lines[-30:]), flush=True)
    summary = next((line for line in reversed(lines) if _SUMMARY.search(line)), lines[-1] if lines else "")
    return {"tests": " ".join(args), "returncode": done.returncode, "summary": summary.strip("= ")}


def run(section: Section) -> str | None:
    failed = []
    for args in selection(section.dry_run):
        if section.out_of_time(" ".join(args)):
            return "timed out: box spent (partial rows)"
        row = run_pytest(args, section.time_left())
        section.row(**row)
        if row["returncode"] != 0:
            failed.append(row["tests"])
    if not section.dry_run and not any("graph" in " ".join(args) for args in selection(False)):
        section.note(f"no {GRAPH_TESTS} in this build: the graph runner's own tests were not run")
    return f"failed: {'; '.join(failed)}" if failed else None
