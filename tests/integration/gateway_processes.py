"""Real gateway processes in front of a fake gRPC scheduler (no model), for tests of the gateway's own behaviour:
tenants and limits across gateways, the HTTP edge."""

from __future__ import annotations

import sys
from pathlib import Path

from pagedserve.services.ports import free_port
from tests.integration.processes import MODEL_DIR, port_is_open
from tests.support.service_process import ServiceProcess, service_env
from tests.support.waiting import wait_for


def _start(name: str, argv: list[str], tmp_dir: Path, port: int) -> ServiceProcess:
    return ServiceProcess(name, argv, tmp_dir / f"{name}-{port}.log", service_env(), port).start()


def start_fake_scheduler(tmp_dir: Path) -> ServiceProcess:
    port = free_port()
    proc = _start("fake-scheduler", [sys.executable, "-m", "tests.integration.fake_scheduler_process", str(port)],
                  tmp_dir, port)
    wait_for(lambda: port_is_open(port), 30, what="the fake scheduler listening")
    return proc


def start_gateway(tmp_dir: Path, scheduler_port: int, *flags: str) -> ServiceProcess:
    """A gateway on the fake scheduler, healthy when returned."""
    port = free_port()
    proc = _start("gateway", [sys.executable, "-m", "pagedserve.services.gateway", str(MODEL_DIR), "--port", str(port),
                              "--scheduler-address", f"127.0.0.1:{scheduler_port}", "--health-poll-interval-s", "0.2",
                              *flags], tmp_dir, port)
    try:
        proc.wait_healthy(120)
    except BaseException:
        proc.stop()
        raise
    return proc
