"""Build the worker of `--tensor-parallel-size N`: a plain Worker for 1; else N-1 follower processes and this
process as rank 0, each rank on its own device (cuda:RANK) or, on CPU, on its share of the threads."""

from __future__ import annotations

import logging
import multiprocessing
import os
from dataclasses import replace

from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.parallel.follower import run_follower
from pagedserve.services.gpu_worker.parallel.group import free_init_method, join_group
from pagedserve.services.gpu_worker.parallel.leader import TensorParallelLeader
from pagedserve.services.gpu_worker.parallel.shard_plan import ShardPlan
from pagedserve.services.gpu_worker.platforms import resolve_device
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig

log = logging.getLogger(__name__)


def build_worker(config: WorkerConfig) -> Worker:
    """The worker for `config`: under tensor parallelism rank 0, its followers started and the group joined.
    Raises UnsupportedModelError (before starting a process) when the model does not split over N ranks."""
    n = config.tensor_parallel_size
    if n == 1:
        return Worker(config)
    ShardPlan.for_rank(load_model_config(config.model_dir, config.dtype), 0, n)  # refuse before spawning
    init_method = free_init_method()
    context = multiprocessing.get_context("spawn")
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    followers = [context.Process(target=run_follower, args=(rank, n, init_method, rank_config(config, rank), level),
                                 name=f"tp-rank-{rank}", daemon=True) for rank in range(1, n)]
    for process in followers:
        process.start()
    rank0 = rank_config(config, 0)
    log.info("tensor parallelism: %d ranks (followers pids %s)", n, [p.pid for p in followers])
    tp = join_group(0, n, init_method, resolve_device(rank0.device), config.distributed_timeout_s)
    return TensorParallelLeader(rank0, tp, followers)


def rank_config(config: WorkerConfig, rank: int) -> WorkerConfig:
    """A rank's device: cuda:RANK on CUDA; on CPU every rank takes 1/N of the cores unless --num-threads says."""
    device = resolve_device(config.device)
    if device.type == "cuda":
        return replace(config, device=f"cuda:{rank}")
    threads = config.num_threads or max(1, (os.cpu_count() or 1) // config.tensor_parallel_size)
    return replace(config, device="cpu", num_threads=threads)
