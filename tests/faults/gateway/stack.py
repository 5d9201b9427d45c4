"""Real processes for the gateway's fault cases: one `pagedserve serve` stack (with an API key, an internal token
and a Redis URL whose password Redis refuses), and extra gateways with their own flags on its scheduler."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pagedserve.services.ports import free_port
from pagedserve.shared.scheduler_stats import SchedulerStats
from tests.integration.processes import MODEL_DIR
from tests.support.fault_stack import scheduler_stats
from tests.support.service_process import ServiceProcess, service_env
from tests.support.waiting import wait_for

API_KEY = "fault-suite-api-key-4d1c"
INTERNAL_TOKEN = "fault-suite-internal-token-9e2b"
REDIS_PASSWORD = "fault-suite-redis-password-7f3a"
MAX_MODEL_LEN = 2048  # prompts up to it are real work
DEFAULT_MAX_TOKENS = 8  # the served folder's generation_config.json default: a request without max_tokens stays short
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def stack_env() -> dict[str, str]:
    return service_env(PAGEDSERVE_INTERNAL_TOKEN=INTERNAL_TOKEN, PAGEDSERVE_API_KEY=API_KEY)


def start_process(name: str, argv: list[str], log_path: Path, port: int) -> ServiceProcess:
    return ServiceProcess(name, argv, log_path, stack_env(), port).start()


@dataclass
class GatewayStack:
    serve: ServiceProcess
    scheduler_port: int
    worker_port: int
    metrics_port: int
    tmp_dir: Path

    @property
    def base_url(self) -> str:
        return self.serve.base_url

    def start_gateway(self, *flags: str, name: str = "gateway") -> ServiceProcess:
        """Another gateway on this stack's scheduler, with its own flags; healthy when returned."""
        port = free_port()
        argv = [sys.executable, "-m", "pagedserve.services.gateway", str(MODEL_DIR), "--port", str(port),
                "--scheduler-address", f"127.0.0.1:{self.scheduler_port}", "--health-poll-interval-s", "0.2", *flags]
        gateway = start_process(name, argv, self.tmp_dir / f"{name}-{port}.log", port)
        try:
            gateway.wait_healthy(120)
        except BaseException:
            gateway.kill()
            raise
        return gateway

    def stats(self) -> SchedulerStats:
        return scheduler_stats(self.scheduler_port, INTERNAL_TOKEN)

    def wait_quiescent(self, timeout_s: float = 60) -> float:
        """Seconds until the scheduler runs and queues nothing and holds no KV block: nothing leaked."""
        start_s = time.monotonic()

        def quiet() -> bool:
            stats = self.stats()
            return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_usage == 0.0

        wait_for(quiet, timeout_s, interval_s=0.1, what="no request running or waiting and KV usage 0")
        return time.monotonic() - start_s


def short_default_model(tmp_dir: Path) -> Path:
    """The default model's folder as links, but for a generation_config.json whose max_new_tokens is
    DEFAULT_MAX_TOKENS (what a request without max_tokens gets; generated requests often have none)."""
    folder = tmp_dir / MODEL_DIR.name
    folder.mkdir()
    for path in MODEL_DIR.iterdir():
        if path.name != "generation_config.json":
            (folder / path.name).symlink_to(path)
    config = json.loads((MODEL_DIR / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": DEFAULT_MAX_TOKENS}))
    return folder


def start_gateway_stack(tmp_dir: Path, redis_port: int, timeout_s: float) -> GatewayStack:
    port, scheduler_port, worker_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    redis_url = f"redis://:wrong-{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0"  # refused: the auth-failure path
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(short_default_model(tmp_dir)), "--port",
            str(port),
            "--scheduler-port", str(scheduler_port), "--worker-port", str(worker_port),
            "--metrics-port", str(metrics_port),
            "--kv-cache-memory-bytes", "128MiB", "--max-model-len", str(MAX_MODEL_LEN), "--redis-url", redis_url,
            "--health-poll-interval-s", "0.2",
            # no admission by predicted wait: these cases load the engine on a shared, slow box, and what they
            # check is the gateway (admission has its own cases in tests/faults/)
            "--max-queue-wait-s", "0"]
    serve = start_process("serve", argv, tmp_dir / "serve.log", port)
    stack = GatewayStack(serve, scheduler_port, worker_port, metrics_port, tmp_dir)
    try:
        serve.wait_healthy(timeout_s)
    except BaseException:
        serve.stop(strict=True)
        raise
    return stack
