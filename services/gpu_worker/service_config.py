"""The gpu-worker process's configuration: the model/KV settings plus where its gRPC server listens."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.cli_config import check_choices
from pagedserve.shared.log_setup import LogLevel
from pagedserve.shared.placeholder_secrets import check_not_placeholder


@dataclass(frozen=True)
class WorkerServiceConfig:
    worker: WorkerConfig
    worker_host: str = "127.0.0.1"  # interface the worker's gRPC server binds
    worker_port: int = 50061  # the worker's gRPC port (the scheduler's --worker-address points here)
    internal_token: str = ""  # shared secret between the services, sent as gRPC metadata (empty: no check)
    drain_timeout_s: float = 300.0  # on SIGTERM: keep serving steps until its scheduler stops sending them
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)
        check_not_placeholder("--internal-token", self.internal_token)
