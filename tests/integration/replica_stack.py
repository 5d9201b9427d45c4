"""Two engine replicas as separate real processes (a worker and a scheduler each), two gateways in front of both
(prefix routing and round-robin), and a real Redis: what the replica tests start, signal and kill one by one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from pagedserve.services.ports import free_port
from tests.integration.processes import MODEL_DIR, RedisServer
from tests.support.service_process import ServiceProcess, service_env
from tests.support.waiting import wait_for

REPLICA_IDS = ("replica-0", "replica-1")


@dataclass
class ReplicaStack:
    redis: RedisServer
    workers: list[ServiceProcess]
    schedulers: list[ServiceProcess]
    gateways: dict[str, tuple[ServiceProcess, int]]  # routing policy -> (gateway, its HTTP port)
    services: list[ServiceProcess] = field(default_factory=list)

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
        def ready() -> bool:
            dead = [s.name for s in self.services if not s.running]
            if dead:
                raise RuntimeError(f"{dead} exited during start-up:\n{self.log_tails()}")
            try:
                return all(self.replicas_up(routing) == dict.fromkeys(REPLICA_IDS, True) for routing in self.gateways)
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s, interval_s=0.5, what="both replicas up on every gateway", detail=self.log_tails)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop(timeout_s=30)


def _start(name: str, argv: list[str], tmp_dir: Path, env: dict) -> ServiceProcess:
    return ServiceProcess(name, [sys.executable, "-m", *argv], tmp_dir / f"{name}.log", env).start()


def start_replica_stack(tmp_dir: Path, redis_server: RedisServer, worker_flags: tuple[str, ...] = (),
                        scheduler_flags: tuple[str, ...] = (), gateway_flags: tuple[str, ...] = (),
                        routings: tuple[str, ...] = ("prefix", "round-robin")) -> ReplicaStack:
    env = service_env()
    worker_ports, scheduler_ports = [free_port(), free_port()], [free_port(), free_port()]
    workers = [_start(f"worker-{i}", ["pagedserve.services.gpu_worker", str(MODEL_DIR), "--worker-port", str(port),
                                      "--num-threads", "1", "--kv-cache-memory-bytes", "256MiB", *worker_flags],
                       tmp_dir, env)
               for i, port in enumerate(worker_ports)]
    schedulers = [_start(f"scheduler-{i}", [
        "pagedserve.services.scheduler", "--scheduler-port", str(port), "--worker-address",
        f"127.0.0.1:{worker_ports[i]}",
        "--instance-id", REPLICA_IDS[i], "--redis-url", redis_server.url, "--redis-prefix-sync-interval-s", "0.05",
        "--redis-stats-interval-s", "0.1", *scheduler_flags], tmp_dir, env) for i, port in enumerate(scheduler_ports)]
    addresses = ",".join(f"127.0.0.1:{port}" for port in scheduler_ports)
    gateways = {}
    for routing in routings:
        port = free_port()
        gateways[routing] = (_start(f"gateway-{routing}", [
            "pagedserve.services.gateway", str(MODEL_DIR), "--port", str(port), "--scheduler-address", addresses,
            "--routing", routing, "--redis-url", redis_server.url, "--health-poll-interval-s", "0.5", *gateway_flags],
            tmp_dir, env),
            port)
    services = [*workers, *schedulers, *(gateway for gateway, _ in gateways.values())]
    return ReplicaStack(redis_server, workers, schedulers, gateways, services)


@contextmanager
def running_replica_stack(tmp_dir: Path, **flags: tuple[str, ...]) -> Iterator[ReplicaStack]:
    """A ready stack over its own Redis (start_replica_stack's flags), stopped with its Redis on exit."""
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    redis_server = RedisServer(tmp_dir / "redis.log")
    redis_server.start()
    stack = start_replica_stack(tmp_dir, redis_server, **flags)
    try:
        stack.wait_ready(600)
        yield stack
    finally:
        stack.stop()
        redis_server.kill()
