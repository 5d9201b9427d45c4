"""Tensor-parallel rank 0: the worker the gRPC server serves. It broadcasts each step to the other ranks, runs its
own shard of the forward with them, samples, and alone answers the scheduler.

A follower process that exits takes the worker down (the scheduler sees a worker restart, as after a crash): a
half-dead group is never served. An idle leader broadcasts keepalives so that the followers' collective timeout
only fires on a rank that is stuck or gone.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup, leave_group
from pagedserve.services.gpu_worker.parallel.step_message import StepMessage
from pagedserve.services.gpu_worker.pending_output import PendingOutput
from pagedserve.services.gpu_worker.worker import PendingStep, Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.step_protocol import StepInput

log = logging.getLogger(__name__)
FOLLOWER_STOP_S = 10.0


class TensorParallelLeader(Worker):
    def __init__(self, config: WorkerConfig, tp: TensorParallelGroup, followers: list[BaseProcess]) -> None:
        super().__init__(config, tp)
        self.tp, self.followers = tp, followers
        self._lock = threading.Lock()  # one collective sequence at a time: a step, a keepalive or the stop
        self._last: PendingOutput | None = None  # the last step's output, not yet sent to the followers
        self._last_broadcast_s = time.monotonic()
        self._closing = threading.Event()
        threading.Thread(target=self._watch_followers, daemon=True, name="tp-watchdog").start()
        threading.Thread(target=self._keep_alive, daemon=True, name="tp-keepalive").start()

    def launch_step(self, step: StepInput) -> PendingStep:
        with self._lock:
            pending = super().launch_step(step)
            if pending.pending is not None:
                self._last = pending.pending
            return pending

    def _before_run(self, step: StepInput, failed: dict, scheduled: dict[str, int]) -> None:
        sampled, dropped = [], []
        if self._last is not None:  # complete at launch: tensor-parallel steps sample on the host path
            output, self._last = self._last.result(), None
            sampled = list(zip(output.req_ids, output.sampled_token_ids, strict=True))
            dropped = [f.req_id for f in output.failed]
        self._broadcast(StepMessage(step, dict(scheduled), list(failed), sampled, dropped))

    def _broadcast(self, message: StepMessage) -> None:
        self.tp.broadcast(message)
        self._last_broadcast_s = time.monotonic()

    def _keep_alive(self) -> None:
        interval_s = self.runner.config.distributed_timeout_s / 4
        while not self._closing.wait(interval_s / 2):
            if not self._lock.acquire(blocking=False):
                continue  # a step is running: the followers are busy with it
            try:
                if not self._closing.is_set() and time.monotonic() - self._last_broadcast_s >= interval_s:
                    self._broadcast(StepMessage())
            except Exception:
                log.exception("tensor-parallel keepalive failed")
            finally:
                self._lock.release()

    def _watch_followers(self) -> None:
        ended = wait([p.sentinel for p in self.followers])
        if self._closing.is_set():
            return
        gone = [p for p in self.followers if p.sentinel in ended]
        for p in gone:
            p.join(1.0)  # reap it, for its exit code
        dead = ", ".join(f"{p.name} (exit {p.exitcode})" for p in gone)
        log.critical("tensor-parallel rank gone: %s; the worker exits (a half group cannot serve)", dead)
        for p in self.followers:
            if p.is_alive():
                p.kill()
        os._exit(1)

    def close(self) -> None:
        """Stop the followers and leave the group (the worker serves no more steps)."""
        self._closing.set()
        with self._lock:
            self._broadcast(StepMessage(stop=True))
        for p in self.followers:
            p.join(FOLLOWER_STOP_S)
            if p.is_alive():
                p.kill()
        leave_group()
