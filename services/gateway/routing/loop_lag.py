"""How late this process's event loop runs: a starved loop (a flood of connections, a long synchronous call)
delays every callback, health answers included, so a health check that timed out while the loop stalled says
nothing about the replica."""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK_S = 0.05  # how often the loop is sampled
_MIN_STALL_S = 0.05  # lateness below this is noise and not kept
_MAX_STALLS = 256


class LoopLag:
    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self._last_tick_s: float | None = None  # None until `run` ticks: nothing measured, no stall reported
        self._stalls: deque[tuple[float, float]] = deque(maxlen=_MAX_STALLS)  # (ended at, seconds late)

    async def run(self) -> None:
        """Sample the loop every tick_s; cancel to stop."""
        self._last_tick_s = time.monotonic()
        while True:
            await asyncio.sleep(self.tick_s)
            self.note_tick(time.monotonic())

    def note_tick(self, now_s: float) -> None:
        assert self._last_tick_s is not None
        late_s = now_s - self._last_tick_s - self.tick_s
        if late_s >= _MIN_STALL_S:
            self._stalls.append((now_s, late_s))
        self._last_tick_s = now_s

    def worst_since(self, since_s: float, now_s: float | None = None) -> float:
        """The longest the loop ran late since `since_s` (monotonic), a stall still under way included."""
        if self._last_tick_s is None:
            return 0.0
        now_s = time.monotonic() if now_s is None else now_s
        ongoing_s = now_s - self._last_tick_s - self.tick_s
        past_s = max((late_s for end_s, late_s in self._stalls if end_s >= since_s), default=0.0)
        return max(ongoing_s, past_s, 0.0)
