"""The engine loop as its tests run it: over the fake worker client, as a background task for one block.

`running_engine` yields an `EngineLoop` whose `run()` is live for the block and cancelled (and awaited) after it;
`outputs_of` collects one request's queue up to its finished output or the error that ended it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.redis_state import NullStateWriter
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.worker_client import WorkerClient
from pagedserve.shared.request_io import RequestOutput
from tests.support.fake_worker_client import DESCRIPTION, FakeWorkerClient
from tests.support.tasks import running


@contextlib.asynccontextmanager
async def running_engine(worker: FakeWorkerClient, state: NullStateWriter | None = None,
                         **options) -> AsyncIterator[EngineLoop]:
    client = cast(WorkerClient, worker)  # the fake stands in for the gRPC client
    loop = EngineLoop(Scheduler(SchedulerConfig(), DESCRIPTION), client, state or NullStateWriter(), **options)
    async with running(loop.run()):
        yield loop


async def outputs_of(queue: asyncio.Queue, timeout_s: float = 10.0) -> list[Any]:
    """RequestOutputs, the last one finished, or ending in the Exception that failed the request."""
    items: list[RequestOutput | Exception] = []
    while not items or not (isinstance(items[-1], Exception) or items[-1].finished):
        items.append(await asyncio.wait_for(queue.get(), timeout_s))
    return items
