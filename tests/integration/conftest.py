"""One pagedserve stack (worker, scheduler, gateway as real processes) with a real Redis, for the whole session."""

from __future__ import annotations

import os
import signal
import subprocess

import grpc
import httpx
import pytest
from openai import OpenAI

from pagedserve.services.internal_auth import token_metadata
from pagedserve.services.proto_convert.scheduler_contract import stats_from_pb
from pagedserve.services.proto_gen import scheduler_pb2, scheduler_pb2_grpc
from pagedserve.shared.scheduler_stats import SchedulerStats
from tests.integration.processes import MODEL_DIR, RedisServer, Stack, TraceCollector, port_is_open, start_stack

STARTUP_TIMEOUT_S = 180
INTERNAL_TOKEN = "integration-internal-token"  # the services' shared gRPC secret, for direct calls to the scheduler


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Stack:
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    tmp_dir = tmp_path_factory.mktemp("stack")
    redis_server = RedisServer(tmp_dir / "redis.log")  # raises (never skips) when redis-server is missing
    redis_server.start()
    collector = TraceCollector()
    collector.server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    env["PAGEDSERVE_INTERNAL_TOKEN"] = INTERNAL_TOKEN
    running = start_stack(tmp_dir, redis_server, collector, env)
    try:
        running.wait_healthy(STARTUP_TIMEOUT_S)
        yield running
    finally:
        _stop(running)
        redis_server.kill()
        collector.server.stop(0)


def _stop(running: Stack) -> None:
    """SIGTERM the launcher: it must stop all three services cleanly and exit 0."""
    running.process.send_signal(signal.SIGTERM)
    try:
        code = running.process.wait(60)
    except subprocess.TimeoutExpired:
        running.process.kill()
        raise AssertionError(f"pagedserve serve did not stop on SIGTERM:\n{running.log_tail()}") from None
    assert code == 0, f"pagedserve serve exited with {code}:\n{running.log_tail()}"
    still_open = [p for p in (running.port, running.scheduler_port, running.worker_port) if port_is_open(p)]
    assert not still_open, f"ports still served after stop: {still_open}"


@pytest.fixture(scope="session")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def http(stack: Stack):
    with httpx.Client(base_url=stack.base_url, timeout=120) as session:
        yield session


@pytest.fixture(scope="session")
def model_name(stack: Stack) -> str:
    return httpx.get(stack.base_url + "/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="session")
def scheduler_stats(stack: Stack):
    """Call to read the scheduler's GetStats directly over gRPC."""
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.scheduler_port}")
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)

    def read() -> SchedulerStats:
        return stats_from_pb(stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=5,
                                           metadata=token_metadata(INTERNAL_TOKEN)))

    yield read
    channel.close()
