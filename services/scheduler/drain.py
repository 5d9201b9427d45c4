"""Stopping without losing what was accepted: on SIGTERM the scheduler takes no new request (readiness DRAINING:
health NOT_SERVING, Generate UNAVAILABLE with a Retry-After, a 503 at the gateway), lets the live ones finish
within the drain timeout, fails what is left with an error its client sees, and only then stops its server."""

from __future__ import annotations

import asyncio
import logging
import time

from services.grpc_errors import ServiceNotReady
from services.scheduler.engine_loop import EngineLoop
from services.scheduler.readiness import NotReady, Readiness

log = logging.getLogger(__name__)
POLL_S = 0.05


async def drain(engine: EngineLoop | None, readiness: Readiness, timeout_s: float) -> int:
    """Returns how many requests were still live at the timeout (and failed)."""
    readiness.set(NotReady.DRAINING)
    if engine is None:
        return 0
    start_s = time.monotonic()
    log.info("draining: %d requests in flight, up to %.0fs", engine.num_live_requests, timeout_s)
    while engine.num_live_requests and time.monotonic() - start_s < timeout_s:
        await asyncio.sleep(POLL_S)
    left = engine.num_live_requests
    if left:
        log.warning("drain timeout after %.0fs: failing %d requests", timeout_s, left)
        engine.fail_all(ServiceNotReady("the scheduler stopped before the request finished (drain timeout)"))
    else:
        log.info("drained in %.1fs", time.monotonic() - start_s)
    return left
