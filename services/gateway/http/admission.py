"""Which requests the gateway takes: at most max_open_requests at once (429 above), none while it drains (503).

Both answers carry Retry-After. Work requests (generation, tokenize, detokenize) are counted from their first byte
to their last, streamed bodies included, so the count reaching 0 means nothing is in flight. Each generation
request also holds a cut signal: a future the drain deadline resolves to an error, which ends the request with
that error (a JSON 503 before its first byte, an error event and [DONE] in a stream).

While every scheduler replica has said it refuses arrivals for a while (`refusing_for_s` > 0, from the router),
generation requests are shed at once: a 429 before their body is read, so a flood costs no parsing, tokenizing or
gRPC call on the cores that run the steps. The wait is the replicas' own promise and lasts a second at most.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedserve.services.gateway.http.errors import OpenAIError, error_response

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
WORK_PATHS = GENERATION_PATHS | {"/tokenize", "/detokenize"}
_REFUSED_WHILE_DRAINING = ("/v1/", "/tokenize", "/detokenize")
OVERLOADED_RETRY_AFTER_S = 1
DRAINING_RETRY_AFTER_S = 1  # another replica can take it at once


@dataclass
class Admission:
    max_open_requests: int
    num_open: int = 0  # work requests between their first and last byte
    draining: bool = False  # set once on SIGTERM: new requests get 503, /health says 503
    refusing_for_s: Callable[[], float] = lambda: 0.0  # seconds every replica refuses arrivals (the router's)
    _cut_signals: set[asyncio.Future] = field(default_factory=set)

    def cut_signal(self) -> asyncio.Future:
        """A future that `cut_all` resolves to the error its request must end with; `release` it when done."""
        signal = asyncio.get_running_loop().create_future()
        self._cut_signals.add(signal)
        return signal

    def release(self, signal: asyncio.Future) -> None:
        self._cut_signals.discard(signal)

    def cut_all(self, error: OpenAIError) -> int:
        """End every generation request in flight with `error`; how many there were."""
        signals, self._cut_signals = self._cut_signals, set()
        for signal in signals:
            if not signal.done():
                signal.set_result(error)
        return len(signals)


def shed_error(refusing_for_s: float) -> OpenAIError:
    return OpenAIError(429, "the server is overloaded: every scheduler replica is refusing new requests; retry later",
                       code="rate_limit_exceeded", retry_after_s=max(1, math.ceil(refusing_for_s)))


def draining_error() -> OpenAIError:
    return OpenAIError(503, "the server is shutting down: retry the request (another replica will take it)",
                       code="service_unavailable", retry_after_s=DRAINING_RETRY_AFTER_S)


class AdmissionGate:
    """ASGI middleware: refuses while draining, sheds generation while the replicas refuse, caps the work requests
    in flight, counts them."""

    def __init__(self, app, admission: Admission, shed_counter=None) -> None:
        self.app = app
        self.admission = admission
        self.shed_counter = shed_counter  # a prometheus Counter of shed requests, or None

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.admission.draining and path.startswith(_REFUSED_WHILE_DRAINING):
            # `Connection: close`: the client's next try opens a new connection, which a load balancer can route
            await error_response(draining_error(), {"Connection": "close"})(scope, receive, send)
            return
        if path not in WORK_PATHS:
            await self.app(scope, receive, send)
            return
        if path in GENERATION_PATHS and (refusing_s := self.admission.refusing_for_s()) > 0:
            if self.shed_counter is not None:
                self.shed_counter.inc()
            await error_response(shed_error(refusing_s))(scope, receive, send)
            return
        if self.admission.num_open >= self.admission.max_open_requests:
            refusal = OpenAIError(429, f"the server is overloaded: {self.admission.max_open_requests} requests are "
                                       f"already open; retry later", code="rate_limit_exceeded",
                                  retry_after_s=OVERLOADED_RETRY_AFTER_S)
            await error_response(refusal)(scope, receive, send)
            return
        self.admission.num_open += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.num_open -= 1
