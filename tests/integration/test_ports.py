"""A port in use is refused, never shared: gRPC lets two processes listen on one port (SO_REUSEPORT) unless told
not to, and a second `pagedserve serve` then served through the first one's scheduler.

Each gRPC server exits 2 with one line naming the port and its flag; two `serve` on the default internal ports
each get their own (the second moves, says so, and serves its own model name); an explicitly chosen taken port
stops `serve` before it starts anything; `serve --max-num-seqs 8` reaches the scheduler, which runs 8 at most.
Start-up polling leaves no `GET /health 503` lines in the log or the metrics.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest

from pagedserve.services.internal_auth import token_metadata
from pagedserve.services.ports import free_port
from pagedserve.services.proto_convert.scheduler_contract import stats_from_pb
from pagedserve.services.proto_gen import scheduler_pb2, scheduler_pb2_grpc
from tests.integration.conftest import INTERNAL_TOKEN
from tests.integration.processes import MODEL_DIR, REPO, wait_for

STARTUP_TIMEOUT_S = 240
EXIT_TIMEOUT_S = 60


@pytest.fixture
def reuseport_holder():
    """A gRPC server with grpc's default options (SO_REUSEPORT on) on a free port, as an older pagedserve held it."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    server.stop(0)


def _exits_with_port_error(argv: list[str], port: int, flag: str, tmp_path: Path) -> None:
    log_path = tmp_path / "second.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        code = process.wait(EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"it shared port {port} instead of refusing it:\n{log_path.read_text()}") from None
    text = log_path.read_text()
    assert code == 2, text
    assert f"port {port} on 127.0.0.1 is already in use" in text and flag in text, text
    assert "Traceback" not in text, text


def test_scheduler_refuses_a_port_in_use(reuseport_holder, tmp_path):
    argv = [sys.executable, "-m", "pagedserve.services.scheduler", "--scheduler-port", str(reuseport_holder),
            "--worker-address", f"127.0.0.1:{free_port()}"]
    _exits_with_port_error(argv, reuseport_holder, "--scheduler-port", tmp_path)


def test_worker_refuses_a_port_in_use(reuseport_holder, tmp_path):
    argv = [sys.executable, "-m", "pagedserve.services.gpu_worker", str(MODEL_DIR), "--worker-port",
            str(reuseport_holder)]
    _exits_with_port_error(argv, reuseport_holder, "--worker-port", tmp_path)


class Serve:
    """One `pagedserve serve` process with its log."""

    def __init__(self, tmp_path: Path, name: str, *flags: str) -> None:
        self.port = free_port()
        self.log_path = tmp_path / f"{name}.log"
        argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(MODEL_DIR), "--port", str(self.port),
                "--kv-cache-memory-bytes", "128MiB", "--max-model-len", "2048", "--no-torch-compile",
                "--internal-token", INTERNAL_TOKEN, "--served-model-name", name, *flags]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}:\n{self.log}")
            return "pagedserve is ready" in self.log

        wait_for(ready, STARTUP_TIMEOUT_S, interval_s=0.5, what="serve ready")

    def scheduler_port(self) -> int:
        return int(re.search(r"scheduler gRPC on 127\.0\.0\.1:(\d+)", self.log).group(1))

    def model_id(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=10).json()["data"][0]["id"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def test_two_serves_on_the_default_ports_never_share_a_scheduler(tmp_path):
    first = Serve(tmp_path, "first")
    second = None
    try:
        first.wait_ready()
        second = Serve(tmp_path, "second", "--max-num-seqs", "8")
        second.wait_ready()
        assert second.scheduler_port() != first.scheduler_port()
        if first.scheduler_port() == 50051:  # the first took the default, so the second had to move
            assert "port 50051 for the scheduler's gRPC server is in use: using" in second.log
        assert (first.model_id(), second.model_id()) == ("first", "second")  # each gateway reaches its own model
        assert "max_num_seqs 64," in first.log and "max_num_seqs 8," in second.log
        for serve in (first, second):  # the launcher waited for the scheduler, not on the gateway's 503s
            assert '"GET /health HTTP/1.1" 503' not in serve.log
            metrics = httpx.get(f"http://127.0.0.1:{serve.port}/metrics", timeout=10).text
            assert 'pagedserve_http_requests_total{route="/health",status="200"}' in metrics
            assert 'route="/health",status="503"' not in metrics

        third = subprocess.run([sys.executable, "-m", "pagedserve.services.cli", "serve", str(MODEL_DIR), "--port",
                                str(free_port()), "--scheduler-port", str(first.scheduler_port())], cwd=REPO,
                               capture_output=True, text=True, timeout=EXIT_TIMEOUT_S)
        assert third.returncode == 2, third.stdout + third.stderr
        assert f"port {first.scheduler_port()} on 127.0.0.1 is already in use" in third.stderr
        assert "--scheduler-port" in third.stderr and third.stdout == ""  # nothing was started

        assert _most_running(second, num_requests=10) == 8
    finally:
        for serve in (second, first):
            if serve is not None:
                serve.stop()


def _most_running(serve: Serve, num_requests: int) -> int:
    """Send requests that run long, and return the most the scheduler reported running at once."""
    body = {"model": "second", "prompt": "Count:", "max_tokens": 8, "ignore_eos": True, "temperature": 0}
    url = f"http://127.0.0.1:{serve.port}/v1/completions"
    with futures.ThreadPoolExecutor(num_requests) as pool:
        replies = [pool.submit(httpx.post, url, json=body, timeout=300) for _ in range(num_requests)]
        most, waited = 0, False
        with grpc.insecure_channel(f"127.0.0.1:{serve.scheduler_port()}") as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            while not all(reply.done() for reply in replies):
                stats = stats_from_pb(stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=10,
                                                    metadata=token_metadata(INTERNAL_TOKEN)))
                most, waited = max(most, stats.num_running), waited or stats.num_waiting > 0
                time.sleep(0.02)
        assert all(reply.result().status_code == 200 for reply in replies)
    assert waited, "no request ever waited: the cap was not reached"
    return most
