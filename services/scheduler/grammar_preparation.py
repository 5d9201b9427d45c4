"""Have the worker compile a request's grammar before the scheduler admits the request (vLLM's WAITING_FOR_FSM).

A grammar can take seconds to compile; compiled inside a step it would hold up every request in that step. The
worker compiles on its own threads while steps go on, and the request joins the waiting queue once it is done.
One call per distinct grammar at a time, at most a few at once (each holds one of the worker's gRPC threads, and
steps need one); grammars the worker compiled before skip the call.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import grpc
import grpc.aio

from pagedserve.services.grpc_errors import WorkerUnavailable
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.structured_output import StructuredOutput

MAX_CONCURRENT_CALLS = 2
MAX_KNOWN_GRAMMARS = 1024


class GrammarWorker(Protocol):
    async def prepare_grammar(self, structured: StructuredOutput) -> None: ...


class GrammarPreparer:
    def __init__(self, worker: GrammarWorker, max_concurrent_calls: int = MAX_CONCURRENT_CALLS) -> None:
        self.worker = worker
        self._calls = asyncio.Semaphore(max_concurrent_calls)
        self._in_flight: dict[str, asyncio.Future] = {}  # key -> the one call compiling it
        self._known: OrderedDict[str, None] = OrderedDict()  # keys the worker compiled, most recent last
        self._waits: set[asyncio.Task] = set()  # the requests' waits for their grammars (held: tasks are weak refs)
        self.num_calls = 0

    def prepare_for(self, req_id: str, structured: StructuredOutput, compiled: Callable[[str], None],
                    refused: Callable[[str, Exception], None]) -> None:
        """Have the request's grammar compiled in the background, then call `compiled(req_id)`, or
        `refused(req_id, error)` when the grammar engine refuses it or the worker cannot be reached."""
        wait = asyncio.create_task(self._prepare_for(req_id, structured, compiled, refused))
        self._waits.add(wait)
        wait.add_done_callback(self._waits.discard)

    async def _prepare_for(self, req_id: str, structured: StructuredOutput, compiled: Callable[[str], None],
                           refused: Callable[[str, Exception], None]) -> None:
        try:
            await self.prepare(structured)
        except (RequestRejected, WorkerUnavailable) as exc:
            refused(req_id, exc)
            return
        compiled(req_id)

    async def prepare(self, structured: StructuredOutput) -> None:
        """Returns once the worker holds the compiled grammar. Raises RequestRejected when the grammar engine
        refuses it, WorkerUnavailable when the worker cannot be reached."""
        key = structured.key
        if key in self._known:
            self._known.move_to_end(key)
            return
        call = self._in_flight.get(key)
        if call is None:
            call = asyncio.ensure_future(self._call(structured))
            self._in_flight[key] = call
            call.add_done_callback(lambda _: self._in_flight.pop(key, None))
        await asyncio.shield(call)  # a waiter that leaves does not cancel the others' call

    def forget(self) -> None:
        """A new worker knows no grammar yet."""
        self._known.clear()

    async def _call(self, structured: StructuredOutput) -> None:
        async with self._calls:
            self.num_calls += 1
            try:
                await self.worker.prepare_grammar(structured)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise RequestRejected(exc.details() or "the grammar cannot be compiled") from None
                raise WorkerUnavailable(f"grammar compile failed: {exc.code().name}: {exc.details()}") from None
        self._known[structured.key] = None
        while len(self._known) > MAX_KNOWN_GRAMMARS:
            self._known.popitem(last=False)
