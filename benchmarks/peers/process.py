"""One server as a subprocess: start it with its output in a log file, wait for /health, stop it (and its group)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from pagedserve.services.ports import free_port


@dataclass(frozen=True)
class ServerSpec:
    label: str  # names the results: pagedserve, llama.cpp, transformers
    argv: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    metrics_port: int | None = None  # where its engine's Prometheus /metrics are, when not on the API port
    headers: dict[str, str] = field(default_factory=dict)  # sent with its /v1 calls here (an API key)
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """None: the bench's default (BASE_URL/metrics)."""
        return None if self.metrics_port is None else f"http://127.0.0.1:{self.metrics_port}/metrics"


def local_pagedserve_spec(model_dir: str, serve_args: str = "") -> ServerSpec:
    """`pagedserve serve MODEL_DIR` on free ports (metrics included), with extra shell-quoted `serve` flags."""
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", model_dir, "--port", str(port),
            "--scheduler-port", str(free_port()), "--worker-port", str(free_port()), "--metrics-port",
            str(metrics_port), *shlex.split(serve_args)]
    return ServerSpec("pagedserve", argv, port, metrics_port=metrics_port)

class ServerProcess:
    """`with ServerProcess(spec, log_path) as server:` starts, waits until healthy, and always stops."""

    def __init__(self, spec: ServerSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        print(f"[{self.spec.label}] starting on port {self.spec.port}: {' '.join(self.spec.argv)}", flush=True)
        print(f"[{self.spec.label}] log: {self.log_path}", flush=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.spec.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.spec.env}, start_new_session=True,
            )  # fmt: skip

    def wait_healthy(self) -> None:
        """Until GET /health is 200 and /v1/models answers; raises when the process exits or time runs out."""
        started_s = time.monotonic()
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() - started_s < self.spec.startup_timeout_s:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.spec.label} exited with {self.process.returncode}:\n{self.log_tail()}")
                if self._healthy(client):
                    print(f"[{self.spec.label}] healthy after {time.monotonic() - started_s:.1f}s", flush=True)
                    return
                time.sleep(0.5)
        raise TimeoutError(f"{self.spec.label} not healthy in {self.spec.startup_timeout_s:.0f}s:\n{self.log_tail()}")

    def _healthy(self, client: httpx.Client) -> bool:
        try:
            health = client.get(self.spec.base_url + "/health")
            models = client.get(self.spec.base_url + "/v1/models", headers=self.spec.headers)
            return health.status_code == 200 and models.status_code == 200
        except httpx.HTTPError:
            return False

    def model_name(self) -> str:
        """The first model the server lists: what benchmark requests must name."""
        response = httpx.get(self.spec.base_url + "/v1/models", headers=self.spec.headers, timeout=10.0,
                             trust_env=False)
        return response.json()["data"][0]["id"]

    def stop(self) -> None:
        """SIGTERM the server (it stops its own children), then SIGKILL its process group if anything is left."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                print(f"[{self.spec.label}] did not stop in {self.spec.stop_timeout_s:.0f}s: killing it", flush=True)
        _kill_group(self.process.pid)
        self.process.wait()
        print(f"[{self.spec.label}] stopped", flush=True)

    def log_tail(self, num_lines: int = 40) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


def _kill_group(pgid: int) -> None:
    """The server was started in its own session, so its group id is its pid; leftovers there get SIGKILL."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
