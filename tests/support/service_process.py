"""One service process of a test stack: started from an argv, its output appended to a log file, signalled,
probed for health, stopped or killed; the one process wrapper the fault and integration stacks share.

A stopped (SIGSTOP) process is sent SIGCONT before it is asked to end, or it could not act on it. `stop` asks with
SIGTERM and, past its timeout, kills it: `strict` turns that into an AssertionError (a graceful stop is part of
what the test checks), otherwise a teardown just goes on.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.run_guard import rss_bytes
from tests.support.waiting import http_ok, wait_for

REPO = Path(__file__).resolve().parents[2]


def service_env(**extra: str) -> dict[str, str]:
    """This process's environment without pagedserve's and OpenTelemetry's settings, unbuffered, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


@dataclass
class ServiceProcess:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    port: int = 0  # its HTTP port, where it has one
    process: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        with open(self.log_path, "a") as log:  # appended: a restart keeps the earlier runs' lines
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=self.env)
        return self

    def restart(self) -> ServiceProcess:
        """Start it again as it was started (after it died or was stopped), appending to its log."""
        self.stop(timeout_s=30)
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, num_lines: int = 40) -> str:
        return "\n".join(f"{self.name}| {line}" for line in self.log().splitlines()[-num_lines:])

    def rss_bytes(self) -> int:
        assert self.process is not None
        return rss_bytes(self.process.pid)

    def signal(self, signum: int) -> None:
        assert self.running and self.process is not None, f"{self.name} is not running:\n{self.log_tail()}"
        self.process.send_signal(signum)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    def wait_healthy(self, timeout_s: float) -> None:
        """Until GET /health answers 200; an exit meanwhile raises at once, with the log's tail."""
        def healthy() -> bool:
            if not self.running:
                raise RuntimeError(f"{self.name} exited with {self.process and self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            return http_ok(self.base_url + "/health")

        wait_for(healthy, timeout_s, interval_s=0.2, what=f"{self.name} /health 200", detail=self.log_tail)

    def stop(self, timeout_s: float = 60, strict: bool = False) -> int | None:
        """SIGTERM and wait; its exit code (None if it never started)."""
        if self.process is None:
            return None
        if self.running:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                if strict:
                    raise AssertionError(f"{self.name} did not stop on SIGTERM within {timeout_s}s:\n"
                                         f"{self.log_tail()}") from None
        return self.process.returncode

    def kill(self) -> None:
        if self.running and self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
