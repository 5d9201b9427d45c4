"""Stopping without losing what was accepted: on SIGTERM the scheduler takes no new request (readiness DRAINING:
health NOT_SERVING, Generate UNAVAILABLE with a Retry-After, a 503 at the gateway) and lets the live ones finish.

With a hand-off margin (--drain-handoff-margin-s > 0), what is still live `margin` before the drain timeout is
handed off at a step boundary: each request ends with finish reason HANDOFF after the tokens it already streamed, its
KV blocks freed, and the gateway resumes it on another replica (prompt + those tokens) while the grace period still
runs. A margin at least the timeout hands off at once. Without one (margin 0), what outlives the timeout fails with
an error its client sees. Only then does the server stop.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pagedserve.services.grpc_errors import ServiceNotReady
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.readiness import NotReady, Readiness

log = logging.getLogger(__name__)
POLL_S = 0.05


async def drain(engine: EngineLoop | None, readiness: Readiness, timeout_s: float,
                handoff_margin_s: float = 0.0) -> int:
    """Returns how many requests were still live at the timeout (and failed); handed-off ones are not counted."""
    readiness.set(NotReady.DRAINING)
    if engine is None:
        return 0
    start_s = time.monotonic()
    log.info("draining: %d requests in flight, up to %.0fs", engine.num_live_requests, timeout_s)
    if handoff_margin_s > 0:
        await _wait_for_live_requests(engine, start_s + max(0.0, timeout_s - handoff_margin_s))
        if engine.num_live_requests:
            log.info("drain: handing off %d requests %.1fs into the drain", engine.hand_off_all(),
                     time.monotonic() - start_s)
    await _wait_for_live_requests(engine, start_s + timeout_s)
    left = engine.num_live_requests
    if left:
        log.warning("drain timeout after %.0fs: failing %d requests", timeout_s, left)
        engine.fail_all(ServiceNotReady("the scheduler stopped before the request finished (drain timeout)"))
    else:
        log.info("drained in %.1fs", time.monotonic() - start_s)
    return left


async def _wait_for_live_requests(engine: EngineLoop, until_s: float) -> None:
    """Until no request is live or time.monotonic() reaches until_s."""
    while engine.num_live_requests and time.monotonic() < until_s:
        await asyncio.sleep(POLL_S)
