"""tests/run_guard.py on a throwaway suite run by a real pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SUITE = """
def test_passes():
    assert True

def test_fails():
    assert 1 == 2, "the canary failure"

def test_after():
    assert True
"""


def run_suite(tmp_path: Path, max_rss_gib: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_canary.py").write_text(SUITE)
    env = {**os.environ, "PAGEDSERVE_TEST_MAX_RSS_GIB": max_rss_gib, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.run_guard",
                           "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_a_failure_is_named_before_the_run_ends(tmp_path):
    result = run_suite(tmp_path, "64")
    assert result.returncode == 1, result.stdout
    immediate = result.stdout.index("CALL FAILED test_canary.py::test_fails: AssertionError: the canary failure")
    assert immediate < result.stdout.index("= FAILURES =")


def test_the_runner_stops_when_its_memory_passes_the_bound(tmp_path):
    result = run_suite(tmp_path, "0")
    assert result.returncode == 3, result.stdout
    assert "GiB after test_canary.py::test_passes" in result.stdout
    assert "stopping before the machine runs out" in result.stdout
    assert "1 passed" in result.stdout and "failed" not in result.stdout  # nothing ran after the first test


def test_a_sigterm_names_the_test_it_cut(tmp_path):
    """A time limit around the run (`timeout` signals the whole group) must say where the run was, then end it."""
    (tmp_path / "test_killed.py").write_text(
        "import os, signal\n\ndef test_passes():\n    pass\n\n"
        "def test_cut():\n    os.kill(os.getpid(), signal.SIGTERM)\n\ndef test_after():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.run_guard",
                             "--rootdir", str(tmp_path), str(tmp_path)], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    assert result.returncode == -signal.SIGTERM, result.stdout + result.stderr
    assert "the test runner got SIGTERM during test_killed.py::test_cut: stopping" in result.stdout
