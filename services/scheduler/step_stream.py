"""The scheduler's end of the worker's Steps stream: steps go out in the order they are submitted, and each reply
resolves the oldest pending step's future (the worker answers in order).

A stream that breaks (the worker died, restarted or failed a step) fails every pending future with its error and
stays broken: the engine loop recovers and the next submit opens a new stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from pagedserve.services.proto_convert.worker_contract import step_output_from_pb
from pagedserve.services.proto_gen import worker_pb2, worker_pb2_grpc
from pagedserve.shared.step_protocol import StepOutput


class StreamEnded(grpc.aio.AioRpcError):
    """The worker closed the stream with steps still unanswered."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                         "the worker closed the step stream")


class StepStream:
    def __init__(self, stub: worker_pb2_grpc.WorkerServiceStub, metadata: list[tuple[str, str]]) -> None:
        self._outbox: asyncio.Queue[worker_pb2.StepRequest | None] = asyncio.Queue()
        self._pending: collections.deque[asyncio.Future[StepOutput]] = collections.deque()
        self.error: BaseException | None = None  # set once the stream broke
        self._call = stub.Steps(self._requests(), metadata=metadata)
        self._reader = asyncio.ensure_future(self._read())

    def submit(self, request: worker_pb2.StepRequest) -> asyncio.Future[StepOutput]:
        """Send the step now (in submit order); the future gets its output, or the stream's error."""
        future = asyncio.get_running_loop().create_future()
        if self.error is not None:
            future.set_exception(self.error)
        else:
            self._pending.append(future)
            self._outbox.put_nowait(request)
        return future

    async def _requests(self) -> AsyncIterator[worker_pb2.StepRequest]:
        while (request := await self._outbox.get()) is not None:
            yield request

    async def _read(self) -> None:
        try:
            async for reply in self._call:
                future = self._pending.popleft()
                if not future.done():  # (a future the loop gave up on is cancelled)
                    future.set_result(step_output_from_pb(reply))
            raise StreamEnded()
        except grpc.aio.AioRpcError as exc:
            self._fail(exc)
        except asyncio.CancelledError:
            self._fail(StreamEnded())
            raise

    def _fail(self, error: BaseException) -> None:
        self.error = error
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(error)

    async def close(self) -> None:
        """End the stream (steps still pending fail) and wait for its reader."""
        self._outbox.put_nowait(None)
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
