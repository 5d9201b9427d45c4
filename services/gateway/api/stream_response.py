"""A streamed response's life: the first delta awaited before any byte is sent, the deltas pumped in a task of
their own, and the SSE response that gives up on a client that stalls or leaves."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from pagedserve.services.gateway.api.disconnect import cancel_quietly, unless_disconnected
from pagedserve.services.gateway.api.generation import ChoiceDelta
from pagedserve.services.gateway.http.admission import Admission

log = logging.getLogger(__name__)

STREAM_BUFFER = 64  # deltas a stream may run ahead of its client


_END = object()  # the pump's last item
_WAKE = object()  # put by a cut, so that a drain waiting for the next delta sees it


@dataclass
class StartedStream:
    """A stream whose first delta has come. Iterate `deltas`; hand `close` to the response as its background task,
    which Starlette runs even when the client left before the body was read (the pump would run on otherwise)."""

    deltas: AsyncIterator[ChoiceDelta]
    pump: asyncio.Task
    cut: asyncio.Future
    admission: Admission

    async def close(self) -> None:
        self.admission.release(self.cut)
        await cancel_quietly(self.pump)


async def first_delta_or_error(request: Request, deltas: AsyncIterator[ChoiceDelta], admission: Admission
                               ) -> StartedStream:
    """Wait for the stream's first delta before any byte of the response is sent, so that a request the scheduler
    refuses (say, more KV cache than the pool holds) gets its own status and a JSON error instead of an error event
    inside a 200; a client that leaves meanwhile cancels the request.

    The deltas run in a task of their own for the whole stream (the request's span is entered there). A cut (the
    drain deadline) ends the stream with its error, before or after the first delta."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=STREAM_BUFFER)
    pump = asyncio.create_task(_pump(deltas, queue))
    cut = admission.cut_signal()
    try:  # one get for the whole wait (a get timed out and retried could drop an item)
        head = await unless_disconnected(request, asyncio.ensure_future(queue.get()), cut)
        if isinstance(head, Exception):
            raise head
    except BaseException:
        admission.release(cut)
        await cancel_quietly(pump)  # closes the deltas, which aborts their requests
        raise
    cut.add_done_callback(lambda _: _wake(queue))
    return StartedStream(_drain(head, queue, pump, cut), pump, cut, admission)


def _wake(queue: asyncio.Queue) -> None:
    """Wake a drain waiting on an empty queue; a full queue needs no wake (its drain checks the cut per item)."""
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(_WAKE)


async def _pump(deltas: AsyncIterator[ChoiceDelta], queue: asyncio.Queue) -> None:
    try:
        async with contextlib.aclosing(deltas) as stream:
            async for delta in stream:
                await queue.put(delta)
    except Exception as exc:
        await queue.put(exc)
    else:
        await queue.put(_END)


async def _drain(item, queue: asyncio.Queue, pump: asyncio.Task, cut: asyncio.Future
                 ) -> AsyncIterator[ChoiceDelta]:
    try:
        while item is not _END:
            if cut.done():
                raise cut.result()
            if isinstance(item, Exception):
                raise item
            if item is not _WAKE:
                yield item
            item = await queue.get()
    finally:
        await cancel_quietly(pump)


class _ClientGone(Exception):
    """The client's connection is gone: the stream ends at its next write."""


class StallGuardedStream(StreamingResponse):
    """An SSE response that gives up on a client that stops reading or goes away.

    Stalled: when one write waits longer than `stall_timeout_s` for the client to take data (the socket and the
    server's write buffer are full), the stream ends there, the connection is closed and the background task aborts
    the request, freeing its KV blocks. Only a write that waits counts: a client that keeps up with generation never
    makes one wait. One slower than that fills the buffers, and then must take about a third of the kernel's send
    buffer (Linux wakes a waiting writer only then; the buffer grows up to 4 MiB) within the timeout.

    Gone: once the HTTP server reports the disconnect, the next write ends the stream. The server drops writes to a
    lost connection without waiting, so a stream whose task missed the cancellation would otherwise run on, with
    nothing to stall it, until its request finished."""

    def __init__(self, events: AsyncIterator[str], stream: StartedStream, req_id: str, stall_timeout_s: float,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"X-Request-Id": req_id, **(headers or {})},
                         background=BackgroundTask(stream.close))
        self.req_id = req_id
        self.stall_timeout_s = stall_timeout_s
        self.client_gone = False

    async def listen_for_disconnect(self, receive) -> None:
        await super().listen_for_disconnect(receive)
        self.client_gone = True

    async def stream_response(self, send) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as stall:
                async def send_or_stall(message) -> None:
                    if self.client_gone:
                        raise _ClientGone
                    stall.reschedule(loop.time() + self.stall_timeout_s)
                    await send(message)
                    stall.reschedule(None)

                await super().stream_response(send_or_stall)
        except _ClientGone:
            log.info("req_id=%s: the client went away: stream aborted", self.req_id)
        except TimeoutError:  # the response stays incomplete: the server closes the connection when we return
            log.warning("req_id=%s: the client read nothing for %g s: stream aborted", self.req_id,
                        self.stall_timeout_s)
