"""A tensor-parallel process group: the collectives a step uses, with timeouts, over torch.distributed.

Ranks run the same forward in lockstep. The device group carries the all-reduces and the logits gather (gloo on
CPU, NCCL on CUDA); the step group (gloo, on the host) carries the step's broadcast from rank 0. Every collective
has the group's timeout: a rank left alone in a collective raises instead of hanging.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class TensorParallelGroup:
    rank: int
    world_size: int
    device_group: dist.ProcessGroup
    step_group: dist.ProcessGroup

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum `tensor` (contiguous, in place) over the ranks; every rank gets the sum."""
        dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def gather_to_leader(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's `tensor` (same shape on each) in rank order on rank 0; None on the others."""
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)] if self.is_leader else None
        dist.gather(tensor, parts, dst=0, group=self.device_group)
        return parts

    def broadcast(self, payload: Any = None) -> Any:
        """Rank 0's `payload` (a picklable object) on every rank: one broadcast over the step group."""
        box = [payload]
        dist.broadcast_object_list(box, src=0, group=self.step_group)
        return box[0]


def free_init_method() -> str:
    """A tcp:// rendezvous on a free local port (rank 0 listens there)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def join_group(rank: int, world_size: int, init_method: str, device: torch.device,
               timeout_s: float) -> TensorParallelGroup:
    """Join the default process group (rank 0 hosts the rendezvous); blocks until every rank joined."""
    timeout = timedelta(seconds=timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
    world = dist.group.WORLD
    step_group = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return TensorParallelGroup(rank, world_size, world, step_group)


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
