"""Waiting on a future while watching the client's connection and the drain's cut: the first to finish wins."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.requests import Request

from pagedserve.services.gateway.http.errors import OpenAIError


async def unless_disconnected(request: Request, future: asyncio.Future, cut: asyncio.Future):
    """The future's result; 499 when the client leaves first, the cut's error when the drain deadline comes first
    (the future is cancelled then, as when the caller is). No polling: a task waits on the request's ASGI channel,
    which carries http.disconnect once the body has been read (Starlette's is_disconnected polls that channel
    through an anyio cancel scope, about 0.3 ms a call: 64 requests waiting seconds for their first token spent
    most of a CPU-second on it)."""
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({future, watcher, cut}, return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            return future.result()
        if cut in done:
            raise cut.result()
        raise OpenAIError(499, "client disconnected")
    finally:
        await cancel_quietly(watcher)
        await cancel_quietly(future)


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (a request's body is read before its generation starts)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def cancel_quietly(future: asyncio.Future) -> None:
    """Cancel the future unless it is done, and wait until it is (its own error, if any, is not raised here)."""
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await future
