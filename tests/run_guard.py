"""Keeps a long suite run diagnosable when it is cut short: failures are named the moment they happen (a run killed
for time or memory still says what failed), a SIGTERM (a time limit around the run: `timeout` signals its whole
process group) is named with the test it interrupted before the runner dies of it, and the runner's own memory is
bounded (a run that would be killed by the kernel stops instead, naming the test after which the bound was crossed)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

# The runner peaks near 4 GiB on the default model's tests (2-core, 24 GiB machines); far above that, something the
# tests made is piling up, and the kernel's OOM killer would end the run without a word.
MAX_RUNNER_RSS_BYTES = int(os.environ.get("PAGEDSERVE_TEST_MAX_RSS_GIB", "10")) * 1024**3
REPORT_STEP_BYTES = 2 * 1024**3  # a line each time the runner's memory passes another multiple of this

_state = {"config": None, "reported_bytes": REPORT_STEP_BYTES, "running": "no test (collection or teardown)"}


def rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process (Linux /proc), this one by default."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def _say(line: str) -> None:
    reporter = _state["config"].pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _die_naming_the_test(signum: int, frame) -> None:
    """Says which test the signal cut, then dies of the signal as the runner would have (exit status 128 + signum)."""
    plugins = _state["config"].pluginmanager
    capture = plugins.get_plugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)  # during a test, stdout is the test's capture, lost with the process
    _say(f"\nthe test runner got {signal.Signals(signum).name} during {_state['running']}: stopping")
    reporter = plugins.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.flush()  # the signal ends the process before its buffered output would be written
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def pytest_configure(config: pytest.Config) -> None:
    _state["config"] = config
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _die_naming_the_test)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _state["running"] = nodeid


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
