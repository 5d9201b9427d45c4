"""Waiting on a condition instead of sleeping a fixed time: the tests' answer to a slow or loaded machine.

`wait_for` (threads, processes) and `wait_for_async` (inside an event loop) poll a condition until it is truthy and
return its value, or raise `TimeoutError` naming what was awaited; timeouts are generous bounds, not expectations.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout_s: float, interval_s: float = 0.05, what: str = "condition",
             detail: Callable[[], str] | None = None) -> T:
    """`detail` (say, a log's tail) is added to the TimeoutError's message."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s" + (f":\n{detail()}" if detail else ""))


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """GET `url` answered 200 (no answer: False)."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


async def wait_for_async(condition: Callable[[], T | Awaitable[T]], timeout_s: float = 10.0,
                         interval_s: float = 0.005, what: str = "condition") -> T:
    """`condition` may be a coroutine function (a check that reads over the network, say)."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} not met within {timeout_s}s")
