"""A tensor-parallel rank other than 0: its own process, its shard of the model and of the KV pool, no gRPC.

It mirrors the requests as rank 0 does, from rank 0's broadcast of each step, and runs the same forward in
lockstep (its collectives pair with rank 0's); it never samples: rank 0's samples reach it with the next step.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from pagedserve.services.gpu_worker.parallel.group import join_group, leave_group
from pagedserve.services.gpu_worker.parallel.step_message import StepMessage
from pagedserve.services.gpu_worker.platforms import resolve_device
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.step_protocol import NewRequest

log = logging.getLogger(__name__)


class TensorParallelFollower(Worker):
    def _mirror(self, new: NewRequest) -> RequestState:
        """Grammars only shape sampling, which rank 0 alone does: none is compiled here."""
        return super()._mirror(replace(new, sampling=replace(new.sampling, structured_output=None)))

    def run(self, message: StepMessage) -> None:
        """Catch up with rank 0's mirrors, then run the step's forward exactly as rank 0 schedules it."""
        for req_id, token_id in message.sampled:
            if (state := self.requests.get(req_id)) is not None:
                state.token_ids.append(token_id)
        step = message.step
        for req_id in [*message.dropped, *step.finished_req_ids]:
            self.requests.pop(req_id, None)
        self._apply_deltas(step)
        for req_id in message.failed:
            self.requests.pop(req_id, None)
        if message.scheduled:
            self.runner.launch([self.requests[r] for r in message.scheduled], list(message.scheduled.values()))


def run_follower(rank: int, world_size: int, init_method: str, config: WorkerConfig, log_level: str) -> None:
    """A follower process's body: join the group, load the shard, run the broadcast steps until told to stop.
    Any error (rank 0 gone, a collective timed out) ends the process with status 1: rank 0 then exits too."""
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s tp-rank-{rank} %(levelname)s %(message)s")
    try:
        tp = join_group(rank, world_size, init_method, resolve_device(config.device),
                        config.distributed_timeout_s)
        worker = TensorParallelFollower(config, tp)
        while not (message := tp.broadcast()).stop:
            if message.step is not None:  # else a keepalive
                worker.run(message)
        leave_group()
    except BaseException:
        log.exception("tensor-parallel rank %d failed", rank)
        os._exit(1)
