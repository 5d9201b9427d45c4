"""One stack for the gateway's fault cases (the package's tests share it; torn down after them)."""

from __future__ import annotations

import subprocess

import pytest
import redis

from services.ports import free_port
from tests.faults.gateway.stack import REDIS_PASSWORD, GatewayStack, start_gateway_stack
from tests.integration.processes import MODEL_DIR, wait_for

STARTUP_TIMEOUT_S = 240


@pytest.fixture(scope="package")
def redis_port():
    """A redis-server that wants a password the stack does not have: its writes fail authentication."""
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--requirepass", REDIS_PASSWORD],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            return redis.Redis(port=port, password=REDIS_PASSWORD, socket_timeout=1).ping()
        except redis.RedisError:
            return False

    try:
        wait_for(answers, 10, what="redis-server answering")
        yield port
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="package")
def gateway_stack(tmp_path_factory, redis_port) -> GatewayStack:
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    stack = start_gateway_stack(tmp_path_factory.mktemp("gateway-faults"), redis_port, STARTUP_TIMEOUT_S)
    try:
        yield stack
    finally:
        code = stack.serve.stop()
        assert code == 0, f"pagedserve serve exited with {code}:\n{stack.serve.tail()}"


@pytest.fixture
def quiescent(gateway_stack: GatewayStack) -> GatewayStack:
    """The stack, with nothing running and no KV block held before and after the test."""
    gateway_stack.wait_quiescent()
    yield gateway_stack
    gateway_stack.wait_quiescent()
