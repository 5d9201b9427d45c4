"""One stack for the gateway's fault cases (the package's tests share it; torn down after them)."""

from __future__ import annotations

import pytest

from tests.faults.gateway.stack import REDIS_PASSWORD, GatewayStack, start_gateway_stack
from tests.integration.processes import MODEL_DIR, RedisServer

STARTUP_TIMEOUT_S = 240


@pytest.fixture(scope="package")
def redis_port(tmp_path_factory):
    """A redis-server that wants a password the stack does not have: its writes fail authentication."""
    server = RedisServer(tmp_path_factory.mktemp("redis") / "redis.log", password=REDIS_PASSWORD)
    server.start()
    try:
        yield server.port
    finally:
        server.kill()


@pytest.fixture(scope="package")
def gateway_stack(tmp_path_factory, redis_port) -> GatewayStack:
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    stack = start_gateway_stack(tmp_path_factory.mktemp("gateway-faults"), redis_port, STARTUP_TIMEOUT_S)
    try:
        yield stack
    finally:
        code = stack.serve.stop(strict=True)
        assert code == 0, f"pagedserve serve exited with {code}:\n{stack.serve.log_tail()}"


@pytest.fixture
def quiescent(gateway_stack: GatewayStack) -> GatewayStack:
    """The stack, with nothing running and no KV block held before and after the test."""
    gateway_stack.wait_quiescent()
    yield gateway_stack
    gateway_stack.wait_quiescent()
