"""The engine loop's table of live requests: one record per request whose stream is open.

A request is live from `EngineLoop.add_request` until its stream ends (finished, failed or aborted); its record
holds everything the loop keeps for it, so that ending it is one `pop`. Invariant: a request id is live at most
once (a second add is a bug, never bad input: the Scheduler refuses a duplicate id before the loop records it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry import trace

from pagedserve.services.scheduler.invariants import require
from pagedserve.shared.request_io import RequestOutput

Item = RequestOutput | Exception  # what a request's queue carries: its outputs, or the error that ended it


@dataclass
class LiveRequest:
    req_id: str
    queue: asyncio.Queue[Item]  # its stream's queue
    span_context: trace.SpanContext | None = None  # its request span, for the links of sampled step spans
    traceparent: str = ""  # W3C traceparent, sent to the worker with its first step


class LiveRequests:
    def __init__(self) -> None:
        self._by_id: dict[str, LiveRequest] = {}

    def add(self, live: LiveRequest) -> None:
        require(live.req_id not in self._by_id, f"request {live.req_id!r} is live twice")
        self._by_id[live.req_id] = live

    def get(self, req_id: str) -> LiveRequest | None:
        return self._by_id.get(req_id)

    def pop(self, req_id: str) -> LiveRequest | None:
        """End the request's record; None when it was not live."""
        return self._by_id.pop(req_id, None)

    def ids(self) -> set[str]:
        return set(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._by_id

    def __iter__(self) -> Iterator[LiveRequest]:
        return iter(list(self._by_id.values()))  # a copy: callers end requests while they iterate
