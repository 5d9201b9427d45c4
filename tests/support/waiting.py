"""Waiting on a condition instead of sleeping a fixed time: the tests' answer to a slow or loaded machine.

`wait_for` (threads, processes) and `wait_for_async` (inside an event loop) poll a condition until it is truthy and
return its value, or raise `TimeoutError` naming what was awaited; timeouts are generous bounds, not expectations.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> T:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s")


async def wait_for_async(condition: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.005,
                         what: str = "condition") -> T:
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        value = condition()
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s")
