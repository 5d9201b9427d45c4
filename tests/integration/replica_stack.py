"""Two engine replicas as separate real processes (a worker and a scheduler each), two gateways in front of both
(prefix routing and round-robin), and a real Redis: what the replica tests start, signal and kill one by one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from services.ports import free_port
from tests.integration.processes import MODEL_DIR, REPO, RedisServer

REPLICA_IDS = ("replica-0", "replica-1")


@dataclass
class Service:
    name: str
    process: subprocess.Popen
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)

    def restart(self) -> None:
        """Start it again as it was started (after it died or was stopped), appending to its log."""
        self.stop()
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen([sys.executable, "-m", *self.argv], stdout=log, stderr=subprocess.STDOUT,
                                            cwd=REPO, env=self.env)

    def log_tail(self, num_lines: int = 30) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()[-num_lines:]
        return "\n".join(f"{self.name}| {line}" for line in lines)

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ReplicaStack:
    redis: RedisServer
    workers: list[Service]
    schedulers: list[Service]
    gateways: dict[str, tuple[Service, int]]  # routing policy -> (gateway, its HTTP port)
    services: list[Service] = field(default_factory=list)

    def base_url(self, routing: str) -> str:
        return f"http://127.0.0.1:{self.gateways[routing][1]}"

    def log_tails(self) -> str:
        return "\n".join(service.log_tail() for service in self.services)

    def replica_gauge(self, routing: str, name: str) -> dict[str, float]:
        """A per-replica gauge of the gateway's /metrics: replica id -> value."""
        text = httpx.get(self.base_url(routing) + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line.startswith(name + "{"):
                values[line.split('replica="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        return values

    def replicas_up(self, routing: str) -> dict[str, bool]:
        """pagedserve_gateway_replica_up of the gateway: replica id -> routable."""
        return {replica: value == 1.0 for replica, value in
                self.replica_gauge(routing, "pagedserve_gateway_replica_up").items()}

    def replica_loads(self, routing: str) -> dict[str, float]:
        """pagedserve_gateway_replica_load: the requests on each replica as the gateway's routing counts them."""
        return self.replica_gauge(routing, "pagedserve_gateway_replica_load")

    def wait_ready(self, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        while time.monotonic() < deadline_s:
            dead = [s.name for s in self.services if s.process.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited during start-up:\n{self.log_tails()}")
            try:
                if all(self.replicas_up(routing) == dict.fromkeys(REPLICA_IDS, True) for routing in self.gateways):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"the replicas were not ready within {timeout_s}s:\n{self.log_tails()}")

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


def _start(name: str, argv: list[str], tmp_dir: Path, env: dict) -> Service:
    log_path = tmp_dir / f"{name}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", *argv], stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                   env=env)
    return Service(name, process, log_path, argv, env)


def start_replica_stack(tmp_dir: Path, redis_server: RedisServer, worker_flags: tuple[str, ...] = (),
                        scheduler_flags: tuple[str, ...] = (), gateway_flags: tuple[str, ...] = (),
                        routings: tuple[str, ...] = ("prefix", "round-robin")) -> ReplicaStack:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    worker_ports, scheduler_ports = [free_port(), free_port()], [free_port(), free_port()]
    workers = [_start(f"worker-{i}", ["services.gpu_worker", str(MODEL_DIR), "--worker-port", str(port),
                                      "--num-threads", "1", "--kv-cache-memory-bytes", "256MiB", *worker_flags],
                       tmp_dir, env)
               for i, port in enumerate(worker_ports)]
    schedulers = [_start(f"scheduler-{i}", [
        "services.scheduler", "--scheduler-port", str(port), "--worker-address", f"127.0.0.1:{worker_ports[i]}",
        "--instance-id", REPLICA_IDS[i], "--redis-url", redis_server.url, "--redis-prefix-sync-interval-s", "0.05",
        "--redis-stats-interval-s", "0.1", *scheduler_flags], tmp_dir, env) for i, port in enumerate(scheduler_ports)]
    addresses = ",".join(f"127.0.0.1:{port}" for port in scheduler_ports)
    gateways = {}
    for routing in routings:
        port = free_port()
        gateways[routing] = (_start(f"gateway-{routing}", [
            "services.gateway", str(MODEL_DIR), "--port", str(port), "--scheduler-address", addresses,
            "--routing", routing, "--redis-url", redis_server.url, "--health-poll-interval-s", "0.5", *gateway_flags],
            tmp_dir, env),
            port)
    services = [*workers, *schedulers, *(gateway for gateway, _ in gateways.values())]
    return ReplicaStack(redis_server, workers, schedulers, gateways, services)
