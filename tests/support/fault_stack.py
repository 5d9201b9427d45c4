"""The fault suite's stack: the three services as separate real processes on free ports, so a fault test can kill,
stop, restart or signal any one of them while the others keep running (tests/integration's `pagedserve serve` owns
all three together). `scheduler_stats` reads any scheduler's stats the way the stacks do."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.ports import free_port
from pagedserve.services.proto_convert.scheduler_contract import integrity_from_pb, stats_from_pb
from pagedserve.services.proto_gen import scheduler_pb2, scheduler_pb2_grpc
from pagedserve.services.scheduler.server import SERVICE_NAME as SCHEDULER_SERVICE
from pagedserve.shared.integrity_report import IntegrityReport
from pagedserve.shared.scheduler_stats import SchedulerStats
from tests.integration.processes import MODEL_DIR
from tests.support.service_process import ServiceProcess, service_env
from tests.support.waiting import wait_for

INTERNAL_TOKEN = "fault-suite-internal-token"
# Quicker detection than the defaults: the worker is probed every 0.2 s and lost when a probe goes unanswered for
# WORKER_PROBE_TIMEOUT_S with no step finishing; a step over the progress timeout is a deadlocked worker (generous:
# a first step of a new shape compiles, and the test machine is shared).
WORKER_PROBE_TIMEOUT_S = 3
SCHEDULER_FLAGS = ("--step-progress-timeout-s", "60", "--worker-probe-interval-s", "0.2",
                   "--worker-probe-timeout-s", str(WORKER_PROBE_TIMEOUT_S))
WORKER_FLAGS = ("--kv-cache-memory-bytes", "256MiB")
STARTUP_TIMEOUT_S = 240


def scheduler_stats(scheduler_port: int, internal_token: str) -> SchedulerStats:
    """The scheduler's GetStats over gRPC, with the internal token it wants."""
    with grpc.insecure_channel(f"127.0.0.1:{scheduler_port}") as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        return stats_from_pb(stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=10,
                                           metadata=(("x-pagedserve-token", internal_token),)))


@dataclass
class FaultStack:
    tmp_dir: Path
    env: dict = field(default_factory=service_env)
    worker_port: int = field(default_factory=free_port)
    scheduler_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    worker_flags: tuple[str, ...] = WORKER_FLAGS  # the worker's flags after its model folder and port

    def __post_init__(self) -> None:
        python = sys.executable
        self.env = {**self.env, "PAGEDSERVE_INTERNAL_TOKEN": INTERNAL_TOKEN, "PYTHONUNBUFFERED": "1"}
        self.worker = self._service("worker", [python, "-m", "pagedserve.services.gpu_worker", str(MODEL_DIR),
                                               "--worker-port", str(self.worker_port), *self.worker_flags])
        self.scheduler = self._service("scheduler", [
            python, "-m", "pagedserve.services.scheduler", "--scheduler-port", str(self.scheduler_port),
            "--worker-address", f"127.0.0.1:{self.worker_port}", *SCHEDULER_FLAGS])
        self.gateway = self._service("gateway", [
            python, "-m", "pagedserve.services.gateway", str(MODEL_DIR), "--port", str(self.port),
            "--scheduler-address", f"127.0.0.1:{self.scheduler_port}", "--health-poll-interval-s", "0.2"])
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=120, trust_env=False)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.scheduler_port}")
        self.stub = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.base_argv = {"scheduler": list(self.scheduler.argv), "gateway": list(self.gateway.argv)}  # as first run

    def _service(self, name: str, argv: list[str]) -> ServiceProcess:
        return ServiceProcess(name, argv, self.tmp_dir / f"{name}.log", self.env)

    @property
    def services(self) -> list[ServiceProcess]:
        return [self.worker, self.scheduler, self.gateway]

    def start(self, timeout_s: float) -> None:
        for service in self.services:
            service.start()
        self.wait_health(200, timeout_s)
        self.warm_up()

    def warm_up(self) -> None:
        """Steps of each kind once (prompt, cached prompt, decodes of a few rows), so first-use compiles are done."""
        body = {"messages": [{"role": "user", "content": "Warm up."}], "max_tokens": 8, "temperature": 0.0}
        for _ in range(2):
            assert self.http.post("/v1/chat/completions", json={**body, "n": 3}).status_code == 200

    def restart_worker(self, *flags: str, timeout_s: float = 240) -> None:
        """A fresh worker process on the same port (after the old one is gone), with different flags if given."""
        assert not self.worker.running
        self.worker.argv = self.worker.argv[:6] + list(flags or self.worker_flags)
        self.worker.start()
        self.wait_health(200, timeout_s)
        self.warm_up()

    def restart_scheduler(self, *flags: str, timeout_s: float = 60) -> None:
        """A fresh scheduler on the same port (after the old one is gone), with extra flags if given."""
        assert not self.scheduler.running
        self.scheduler.argv = self.scheduler.argv[:7 + len(SCHEDULER_FLAGS)] + list(flags)
        self.wait_health(503, 15)  # the gateway saw the old one go: its 200 below is about the new one
        self.scheduler.start()
        wait_for(self.scheduler_ready, timeout_s, interval_s=0.1, what="the new scheduler SERVING")
        self.wait_health(200, timeout_s)

    def health(self) -> int:
        try:
            return self.http.get("/health", timeout=2).status_code
        except httpx.HTTPError:
            return 0

    def wait_health(self, status: int, timeout_s: float) -> float:
        """Seconds until the gateway's /health answered `status`."""
        start_s = time.monotonic()
        try:
            wait_for(lambda: self.health() == status, timeout_s, interval_s=0.1, what=f"/health {status}")
        except TimeoutError:
            raise TimeoutError(f"/health not {status} within {timeout_s}s\n{self.logs()}") from None
        return time.monotonic() - start_s

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail()}" for s in self.services)

    def metadata(self) -> tuple:
        return (("x-pagedserve-token", INTERNAL_TOKEN),)

    def scheduler_ready(self) -> bool:
        """The scheduler's own gRPC readiness (answered without the internal token, like any probe)."""
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE), timeout=2)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def integrity(self) -> IntegrityReport:
        return integrity_from_pb(self.stub.CheckIntegrity(scheduler_pb2.CheckIntegrityRequest(), timeout=5,
                                                          metadata=self.metadata()))

    def stats(self) -> SchedulerStats:
        return scheduler_stats(self.scheduler_port, INTERNAL_TOKEN)

    def assert_quiescent_and_intact(self, timeout_s: float = 10) -> IntegrityReport:
        """No request left anywhere and the block accounting exact: nothing leaked."""
        def quiet() -> IntegrityReport | None:
            report = self.integrity()
            return report if report.num_live_requests == 0 and report.num_used_blocks == 0 else None

        report = wait_for(quiet, timeout_s, interval_s=0.1, what="no live request and no block in use")
        assert report.ok, report.problem
        assert report.num_free_blocks + report.num_cached_blocks == report.num_blocks
        return report

    def close(self) -> None:
        for service in reversed(self.services):
            service.kill()
        self.http.close()
        self.channel.close()


@contextlib.contextmanager
def running_fault_stack(tmp_dir: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[FaultStack]:
    """A started, warmed-up FaultStack for the block; every process is killed after it."""
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    stack = FaultStack(tmp_dir)
    try:
        stack.start(timeout_s)
        yield stack
    finally:
        stack.close()
