"""A tensor-parallel rank's KV budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedserve.services.gpu_worker.worker_config import WorkerConfig

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup
    from pagedserve.services.gpu_worker.platforms.platform import Platform


def rank_kv_budget_bytes(platform: Platform, config: WorkerConfig, tp: TensorParallelGroup | None) -> int:
    """The bytes this rank's KV shard may take: a GPU rank's own free memory; on CPU the ranks share the host, so
    `--kv-cache-memory` is the whole pool's and each rank takes 1/N of it (as many blocks as one rank would have)."""
    budget = platform.kv_cache_budget_bytes(config)
    if tp is not None and platform.device.type == "cpu":
        return budget // tp.world_size
    return budget
