"""The requests waiting for a step, in the order steps take them: priority first (lower is more urgent, as vLLM's
`priority`), then, within a priority, the tenant of the smallest fair share (FairShare), then queue position.

Positions are first in, first out, and a request put back at the front (preempted, or sitting out a step) goes
before all others of its priority and tenant. With one priority and one tenant the order is exactly first come,
first served. Requests are kept in one FIFO per (priority, tenant), so taking the next costs O(tenants), not
O(requests).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from pagedserve.services.scheduler.fair_share import FairShare
from pagedserve.services.scheduler.request import Request


class WaitingQueue:
    def __init__(self, fair_share: FairShare) -> None:
        self.fair_share = fair_share
        self._fifos: dict[int, dict[str, deque[Request]]] = {}  # priority -> tenant -> requests in position order
        self._positions: dict[str, int] = {}  # req_id -> position (smaller goes first)
        self._next_back, self._next_front = 0, -1

    def __len__(self) -> int:
        return len(self._positions)

    def __bool__(self) -> bool:
        return bool(self._positions)

    def __contains__(self, request: Request) -> bool:
        fifo = self._fifos.get(request.priority, {}).get(request.tenant)
        return request.req_id in self._positions and fifo is not None and request in fifo

    def __iter__(self) -> Iterator[Request]:
        """By priority, then position (tenants interleaved by arrival, not by share)."""
        for priority in sorted(self._fifos):
            yield from heapq.merge(*self._fifos[priority].values(), key=self._position)

    def append(self, request: Request) -> None:
        self._positions[request.req_id] = self._next_back
        self._next_back += 1
        self._fifo(request).append(request)

    def appendleft(self, request: Request) -> None:
        self._positions[request.req_id] = self._next_front
        self._next_front -= 1
        self._fifo(request).appendleft(request)

    def remove(self, request: Request) -> None:
        tenants = self._fifos[request.priority]
        fifo = tenants[request.tenant]
        fifo.remove(request)  # O(1) for the head, which is what steps take
        del self._positions[request.req_id]
        if not fifo:
            del tenants[request.tenant]
            if not tenants:
                del self._fifos[request.priority]

    def peek(self) -> Request | None:
        """The request the next admission takes: most urgent priority, least-served tenant, earliest position."""
        if not self._fifos:
            return None
        tenants = self._fifos[min(self._fifos)]
        share = self.fair_share.share
        tenant = min(tenants, key=lambda t: (share(t), self._position(tenants[t][0])))
        return tenants[tenant][0]

    def only(self, priority: int, tenant: str) -> bool:
        """Whether every waiting request (if any) has this priority and tenant."""
        return not self._fifos or (set(self._fifos) == {priority} and set(self._fifos[priority]) == {tenant})

    @property
    def most_urgent_priority(self) -> int | None:
        return min(self._fifos) if self._fifos else None

    def ahead_of(self, priority: int, tenant: str) -> Iterator[Request]:
        """The requests a new one of this priority and tenant would find ahead of it: every one more urgent, and of
        its priority those of its own tenant and of tenants served less or as much (a tie keeps arrival order)."""
        share = self.fair_share.share(tenant)
        for queued_priority, tenants in self._fifos.items():
            if queued_priority > priority:
                continue
            for queued_tenant, fifo in tenants.items():
                if (queued_priority < priority or queued_tenant == tenant
                        or self.fair_share.share(queued_tenant) <= share):
                    yield from fifo

    def _fifo(self, request: Request) -> deque[Request]:
        return self._fifos.setdefault(request.priority, {}).setdefault(request.tenant, deque())

    def _position(self, request: Request) -> int:
        return self._positions[request.req_id]
