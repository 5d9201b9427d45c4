"""Real gateway processes in front of a fake gRPC scheduler (no model), for tests of the gateway's own behaviour:
tenants and limits across gateways, the HTTP edge."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.integration.processes import MODEL_DIR, REPO, free_port, port_is_open, wait_for


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    return {**env, "PYTHONUNBUFFERED": "1"}


@dataclass
class Proc:
    process: subprocess.Popen
    log_path: Path
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _start(argv: list[str], log_path: Path, port: int) -> Proc:
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=clean_env())
    return Proc(process, log_path, port)


def start_fake_scheduler(tmp_dir: Path) -> Proc:
    port = free_port()
    proc = _start([sys.executable, "-m", "tests.integration.fake_scheduler_process", str(port)],
                  tmp_dir / f"fake-scheduler-{port}.log", port)
    wait_for(lambda: port_is_open(port), 30, what="the fake scheduler listening")
    return proc


def start_gateway(tmp_dir: Path, scheduler_port: int, *flags: str) -> Proc:
    """A gateway on the fake scheduler, healthy when returned."""
    port = free_port()
    proc = _start([sys.executable, "-m", "services.gateway", str(MODEL_DIR), "--port", str(port),
                   "--scheduler-address", f"127.0.0.1:{scheduler_port}", "--health-poll-interval-s", "0.2", *flags],
                  tmp_dir / f"gateway-{port}.log", port)

    def healthy() -> bool:
        if proc.process.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.process.returncode}:\n{proc.log()[-3000:]}")
        try:
            return httpx.get(proc.base_url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 120, interval_s=0.2, what="the gateway healthy")
    except BaseException:
        proc.stop()
        raise
    return proc
