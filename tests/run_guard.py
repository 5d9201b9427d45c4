"""Keeps a long suite run diagnosable when it is cut short: failures are named the moment they happen (a run killed
for time or memory still says what failed), and the runner's own memory is bounded (a run that would be killed by
the kernel stops instead, naming the test after which the bound was crossed)."""

from __future__ import annotations

import os

import pytest

# The runner peaks near 4 GiB on the default model's tests (2-core, 24 GiB machines); far above that, something the
# tests made is piling up, and the kernel's OOM killer would end the run without a word.
MAX_RUNNER_RSS_BYTES = int(os.environ.get("PAGEDSERVE_TEST_MAX_RSS_GIB", "10")) * 1024**3
REPORT_STEP_BYTES = 2 * 1024**3  # a line each time the runner's memory passes another multiple of this

_state = {"config": None, "reported_bytes": REPORT_STEP_BYTES}


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (Linux /proc), this one by default."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _say(line: str) -> None:
    reporter = _state["config"].pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    _state["config"] = config


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else report.longreprtext.strip()
        _say(f"\n{report.when.upper()} FAILED {report.nodeid}: {message.splitlines()[0] if message else ''}")


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    rss = rss_bytes()
    if rss >= _state["reported_bytes"]:
        _state["reported_bytes"] = (rss // REPORT_STEP_BYTES + 1) * REPORT_STEP_BYTES
        _say(f"\nthe test runner holds {rss / 1024**3:.1f} GiB after {nodeid}")
    if rss > MAX_RUNNER_RSS_BYTES:
        pytest.exit(f"the test runner holds {rss / 1024**3:.1f} GiB after {nodeid} (bound "
                    f"{MAX_RUNNER_RSS_BYTES / 1024**3:.0f} GiB): stopping before the machine runs out", returncode=3)
