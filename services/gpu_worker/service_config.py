"""The gpu-worker process's configuration: the model/KV settings plus where its gRPC server listens."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.internal_tls import InternalTLSConfig
from pagedserve.shared.cli_config import check_choices
from pagedserve.shared.log_setup import LogLevel
from pagedserve.shared.placeholder_secrets import check_not_placeholder


@dataclass(frozen=True)
class WorkerServiceConfig:
    worker: WorkerConfig
    worker_host: str = "127.0.0.1"  # interface the worker's gRPC server binds
    worker_port: int = 50061  # the worker's gRPC port (the scheduler's --worker-address points here)
    internal_token: str = ""  # shared secret between the services, sent as gRPC metadata (empty: no check)
    tls: InternalTLSConfig = field(default_factory=InternalTLSConfig)  # services/internal_tls.py; with --worker-tls
    worker_tls: bool = field(default=False, metadata={"help": (
        "serve the worker's gRPC port with TLS from --internal-tls-cert/-key, requiring a client certificate from "
        "--internal-tls-ca when set (the scheduler's --worker-tls dials it so); false: plaintext, the TLS files "
        "unused (a scheduler and worker sharing a pod's loopback)")})
    # a plaintext port serving gRPC health alone (probes that cannot speak TLS); 0: none. Health is always on the
    # gRPC port too.
    worker_health_port: int = 0
    drain_timeout_s: float = 300.0  # on SIGTERM: keep serving steps until its scheduler stops sending them
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)
        check_not_placeholder("--internal-token", self.internal_token)
        if self.worker_tls and not self.tls.serves_tls:
            raise ValueError("--worker-tls needs --internal-tls-cert and --internal-tls-key (the worker's certificate)")
