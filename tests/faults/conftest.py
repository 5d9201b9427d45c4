"""One FaultStack (worker, scheduler, gateway as separate processes) for the fault suite; tests restart what they
break and leave the stack healthy and quiescent."""

from __future__ import annotations

import os

import pytest

from tests.faults.stack import FaultStack
from tests.integration.processes import MODEL_DIR

STARTUP_TIMEOUT_S = 240


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> FaultStack:
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    running = FaultStack(tmp_path_factory.mktemp("faults"), env)
    try:
        running.start(STARTUP_TIMEOUT_S)
        yield running
    finally:
        running.close()


@pytest.fixture
def healthy(stack: FaultStack) -> FaultStack:
    """The stack, checked healthy and leak-free before and after the test."""
    stack.wait_health(200, 60)
    stack.assert_quiescent_and_intact()
    yield stack
    stack.wait_health(200, 240)
    stack.assert_quiescent_and_intact()
