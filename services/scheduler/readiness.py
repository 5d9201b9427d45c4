"""Why the scheduler is not taking new requests right now; none means ready. gRPC readiness health follows it.

Requests already accepted are not affected: a worker that drains or a scheduler that drains still finishes them.
"""

from __future__ import annotations

import asyncio
import enum


class NotReady(enum.Enum):
    STARTING = "the scheduler is waiting for its worker"
    WORKER_LOST = "the scheduler lost its worker and is waiting for it to come back"
    WORKER_NOT_SERVING = "the scheduler's worker is not serving (loading or draining)"
    DRAINING = "the scheduler is draining before it stops"


class Readiness:
    def __init__(self, *initial: NotReady) -> None:
        self._reasons: set[NotReady] = set(initial)
        self._changed = asyncio.Event()

    @property
    def ready(self) -> bool:
        return not self._reasons

    @property
    def reason(self) -> str:
        """The most telling reason (declaration order), or empty when ready."""
        return next((r.value for r in NotReady if r in self._reasons), "")

    def has(self, reason: NotReady) -> bool:
        return reason in self._reasons

    def set(self, reason: NotReady, active: bool = True) -> None:
        was_ready = self.ready
        if active:
            self._reasons.add(reason)
        else:
            self._reasons.discard(reason)
        if self.ready != was_ready:
            self._changed.set()

    async def wait_changed(self) -> bool:
        """Wait until readiness flips (or flipped since the last call); returns the current state."""
        await self._changed.wait()
        self._changed.clear()
        return self.ready
