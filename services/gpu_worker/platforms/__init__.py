"""Device platforms: what differs between CPUs and GPUs lives here, chosen once per worker (platform_for)."""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.platforms.platform import Platform
from pagedserve.services.gpu_worker.worker_config import WorkerConfig


def resolve_device(name: str) -> torch.device:
    """`--device`: auto means cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def platform_for(config: WorkerConfig) -> Platform:
    """The platform of the configured device, with the configured kernel options."""
    device = resolve_device(config.device)
    if device.type == "cuda":
        from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform

        return CudaPlatform(device, config.torch_compile, config.batch_invariant)
    if device.type == "cpu":
        from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform

        return CpuPlatform.from_config(config)
    raise ValueError(f"no platform for device {config.device!r}: use cpu, cuda or cuda:N")
