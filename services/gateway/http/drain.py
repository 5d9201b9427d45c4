"""The gateway's HTTP server with a graceful stop: on SIGTERM (or Ctrl-C) it drains, then exits 0.

Draining: the listening socket stays open and answers (so a load balancer that has not yet noticed sees 503 +
Retry-After rather than refused connections), /health says 503, new work gets 503 + Retry-After, and requests in
flight run on. When none is left the server stops. At --drain-timeout-s those still running are cut: a stream
gets an error event and [DONE], a whole response a JSON 503; the server stops once they are answered (at most
CUT_GRACE_S later). A second Ctrl-C stops at once.
"""

from __future__ import annotations

import logging
import signal
import time

import uvicorn

from pagedserve.services.gateway.http.admission import Admission
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.shared.drain_timing import CUT_GRACE_S

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, admission: Admission, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.admission = admission
        self.drain_timeout_s = drain_timeout_s
        self.deadline_s: float | None = None  # set by the first SIGTERM / SIGINT
        self.cut_at_s: float | None = None
        self._announced = False

    def handle_exit(self, sig: int, frame) -> None:
        """Runs as the signal handler: only flags here (uvicorn's own would stop at once and re-raise the signal
        after shutting down, so the process would end by SIGTERM, exit code 143)."""
        if self.deadline_s is None:
            self.deadline_s = time.monotonic() + self.drain_timeout_s
            self.admission.draining = True
        elif sig == signal.SIGINT:
            self.should_exit = self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.deadline_s is not None and not self.should_exit:
            self._drain_step()
        return await super().on_tick(counter)

    def _drain_step(self) -> None:
        now_s = time.monotonic()
        if not self._announced:  # not from the signal handler: logging there could deadlock on the handler's lock
            log.info("draining: %d request(s) in flight, up to %g s; new requests get 503", self.admission.num_open,
                     self.drain_timeout_s)
            self._announced = True
        if self.admission.num_open == 0:
            log.info("drained: no request in flight, stopping")
            self.should_exit = True
        elif self.cut_at_s is None and now_s >= self.deadline_s:
            num_cut = self.admission.cut_all(OpenAIError(
                503, f"the server is shutting down and its drain timeout ({self.drain_timeout_s:g} s) has passed: "
                     "this request was cut; retry it", code="service_unavailable"))
            log.warning("drain timeout (%g s): cut %d request(s) still running", self.drain_timeout_s, num_cut)
            self.cut_at_s = now_s
        elif self.cut_at_s is not None and now_s >= self.cut_at_s + CUT_GRACE_S:
            log.warning("%d request(s) still open %g s after the cut: stopping anyway", self.admission.num_open,
                        CUT_GRACE_S)
            self.should_exit = True
