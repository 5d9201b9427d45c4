"""One FaultStack (worker, scheduler, gateway as separate processes) for the fault suite; tests restart what they
break and leave the stack healthy and quiescent."""

from __future__ import annotations

import pytest

from tests.support.fault_stack import FaultStack, running_fault_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> FaultStack:
    with running_fault_stack(tmp_path_factory.mktemp("faults")) as running:
        yield running


@pytest.fixture
def healthy(stack: FaultStack) -> FaultStack:
    """The stack, checked healthy and leak-free before and after the test."""
    stack.wait_health(200, 60)
    stack.assert_quiescent_and_intact()
    yield stack
    stack.wait_health(200, 240)
    stack.assert_quiescent_and_intact()
