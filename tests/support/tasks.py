"""Background tasks in async tests: run one for the length of a block, then cancel it and wait for it to end.

`running` never leaves a task behind, whatever the block raises; `run_until` runs a coroutine until a condition
holds (or raises `TimeoutError`, naming what it waited for).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from tests.support.waiting import wait_for_async


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, Any]) -> AsyncIterator[asyncio.Task]:
    task = asyncio.create_task(coro)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def cancelled_after(coro: Coroutine[Any, Any, Any], delay_s: float, timeout_s: float = 2.0) -> asyncio.Task:
    """Start `coro`, cancel it `delay_s` later (the sleep picks a point of its loop), and return its task once it
    ended; one that ignores the cancel for `timeout_s` fails the test."""
    task = asyncio.create_task(coro)
    await asyncio.sleep(delay_s)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    assert done, "the task ignored its cancellation"
    return task


async def run_until(coro: Coroutine[Any, Any, Any], condition: Callable[[], object], timeout_s: float = 10.0,
                    what: str = "condition") -> None:
    async with running(coro):
        await wait_for_async(condition, timeout_s, what=what)
