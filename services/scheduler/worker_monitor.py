"""Watches the worker between steps: a worker that stopped answering, stopped serving or came back as a new
incarnation (a restart: empty KV pool, maybe fewer blocks) is reported to the engine loop, which then fails what
was in flight, drops its block state and prefix cache, and re-describes the worker before it serves again.

A probe that goes unanswered counts only when no step finished since it was sent (a step that finishes is proof of
life); then the worker is lost, and a step in flight is abandoned: a stopped or partitioned worker is found within
about a probe timeout, busy or not. A worker that answers probes but never finishes its step (a deadlock in the
forward) runs into the step's deadline, --step-progress-timeout-s, instead.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from pagedserve.services.grpc_errors import WorkerUnavailable
from pagedserve.services.scheduler.readiness import NotReady, Readiness
from pagedserve.shared.step_protocol import ModelDescription

log = logging.getLogger(__name__)


class WorkerStatus(enum.Enum):
    UNREACHABLE = "unreachable"  # no answer within the probe's deadline (dead, stopped, partitioned)
    NOT_SERVING = "not serving"  # answers, but is loading or draining
    SERVING = "serving"


@dataclass(frozen=True)
class WorkerProbe:
    status: WorkerStatus
    description: ModelDescription | None = None  # set when SERVING
    detail: str = ""  # why it was unreachable


class ProbedWorker(Protocol):
    address: str

    async def probe(self, timeout_s: float) -> WorkerProbe: ...


class MonitoredEngine(Protocol):
    readiness: Readiness
    recovering: bool  # the loop is already waiting for the worker itself
    last_step_end_s: float  # time.monotonic() when the last step call returned

    @property
    def worker_description(self) -> ModelDescription: ...

    def worker_lost(self, error: WorkerUnavailable) -> None: ...


def same_worker(a: ModelDescription, b: ModelDescription) -> bool:
    """Whether block ids of `a` are still valid on `b`: the same incarnation and the same pool."""
    return (a.incarnation_id, a.num_kv_blocks, a.block_size) == (b.incarnation_id, b.num_kv_blocks, b.block_size)


class WorkerMonitor:
    def __init__(self, worker: ProbedWorker, engine: MonitoredEngine, interval_s: float, timeout_s: float) -> None:
        self.worker = worker
        self.engine = engine
        self.interval_s = interval_s
        self.timeout_s = timeout_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.probe_once()

    async def probe_once(self) -> None:
        sent_s = time.monotonic()
        self.judge(await self.worker.probe(self.timeout_s), sent_s)

    def judge(self, probe: WorkerProbe, sent_s: float) -> None:
        engine = self.engine
        if engine.recovering:
            return
        if probe.status is WorkerStatus.UNREACHABLE:
            if engine.last_step_end_s < sent_s:
                engine.worker_lost(WorkerUnavailable(f"the worker at {self.worker.address} does not answer "
                                                     f"({probe.detail})"))
            return
        engine.readiness.set(NotReady.WORKER_NOT_SERVING, probe.status is WorkerStatus.NOT_SERVING)
        if probe.description is not None and not same_worker(probe.description, engine.worker_description):
            log.warning("the worker at %s restarted (incarnation %s, %d blocks of %d tokens)", self.worker.address,
                        probe.description.incarnation_id, probe.description.num_kv_blocks,
                        probe.description.block_size)
            engine.worker_lost(WorkerUnavailable("the worker restarted; requests in flight were lost"))
