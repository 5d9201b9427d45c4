"""Schemathesis over the gateway's /openapi.json (real processes, bounded examples): no request it makes, valid
or not, gets a server error."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.faults.gateway.stack import AUTH
from tests.integration.processes import REPO

HOOKS = "tests.faults.gateway.schemathesis_hooks"
RUNS = {
    # generated and schema examples, valid and invalid, with generations bounded by the hooks; fuzzing repeats
    # until --max-time is spent
    "fuzzing": ["--phases", "examples,fuzzing,stateful", "--max-examples", "12", "--max-time", "45"],
    # boundary and type-confusion values of every field (invalid data only: the hooks do not reach this phase)
    "coverage": ["--phases", "coverage", "--mode", "negative", "--max-examples", "12", "--max-time", "90"],
}


@pytest.mark.parametrize("run", RUNS)
def test_no_server_error_on_any_generated_request(gateway_stack, run):
    argv = [sys.executable, "-m", "schemathesis.cli", "run", f"{gateway_stack.base_url}/openapi.json",
            "--checks", "not_a_server_error", "--workers", "1", "--seed", "28", "--request-timeout", "120",
            "--header", f"Authorization:{AUTH['Authorization']}", "--output-sanitize", "false",
            *RUNS[run]]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": HOOKS, "PYTHONPATH": str(REPO)})
    summary = done.stdout[-3000:]
    print(summary)
    assert done.returncode == 0, summary
    cases = re.search(r"Test cases:\s*\n\s*(.+)", summary)
    # every generated case passed; a case schemathesis skips (one it could not build) sends no request
    counts = cases and re.fullmatch(r"(\d+) generated, (\d+) passed(, \d+ skipped)?", cases.group(1).strip())
    assert counts and counts.group(1) == counts.group(2), summary
