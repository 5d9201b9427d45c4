"""The scheduler process's configuration: scheduling policy, its gRPC address, its worker and Redis."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.services.internal_tls import InternalTLSConfig
from pagedserve.services.scheduler.admission import AdmissionConfig
from pagedserve.services.scheduler.cluster.config import PodDeletionCostConfig
from pagedserve.services.scheduler.redis_state import RedisStateConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.cli_config import check_choices
from pagedserve.shared.event_loop import Loop
from pagedserve.shared.log_setup import LogLevel
from pagedserve.shared.placeholder_secrets import check_not_placeholder


@dataclass(frozen=True)
class SchedulerServiceConfig:
    scheduler: SchedulerConfig
    state: RedisStateConfig
    admission: AdmissionConfig
    tls: InternalTLSConfig = field(default_factory=InternalTLSConfig)  # services/internal_tls.py
    scale_down: PodDeletionCostConfig = field(default_factory=PodDeletionCostConfig)  # services/scheduler/cluster
    scheduler_host: str = "127.0.0.1"  # interface the scheduler's gRPC server binds
    scheduler_port: int = 50051  # the scheduler's gRPC port (the gateway's --scheduler-address points here)
    # a plaintext port serving gRPC health alone (kubelet probes cannot speak TLS); 0: none. Health is always on the
    # gRPC port too.
    health_port: int = 0
    metrics_host: str = "127.0.0.1"  # interface of this scheduler's Prometheus /metrics (0.0.0.0 for all)
    metrics_port: int = 0  # HTTP port of this scheduler's Prometheus /metrics (8001 under `serve`); 0: none
    worker_address: str = "127.0.0.1:50061"  # host:port of this scheduler's gpu-worker
    worker_tls: bool = field(default=False, metadata={"help": (
        "dial the worker with TLS: --internal-tls-ca verifies its certificate (for the name in --worker-address, or "
        "--internal-tls-server-name), --internal-tls-cert/-key are presented as this scheduler's client certificate "
        "(the worker's own --worker-tls); false: plaintext (a worker on the pod's loopback)")})
    internal_token: str = ""  # shared secret between the services, sent as gRPC metadata (empty: no check)
    instance_id: str = ""  # names this scheduler's Redis keys; empty: hostname-port
    step_progress_timeout_s: float = 120.0  # a step running longer means a hung worker: its requests fail, not ready
    worker_probe_interval_s: float = 1.0  # how often the worker's health and incarnation are checked
    worker_probe_timeout_s: float = 5.0  # a probe unanswered this long (no step finishing meanwhile) is a lost worker
    drain_timeout_s: float = 300.0  # on SIGTERM: no new requests, those in flight get this long to finish
    drain_handoff_margin_s: float = field(default=5.0, metadata={"help": (
        "draining: this long before --drain-timeout-s ends, requests still live are handed off (finish reason "
        "handoff, their blocks freed) for the gateway to resume on another replica; a margin at least the timeout "
        "hands off at once; 0: no hand-off, what outlives the timeout fails")})
    trace_step_interval: int = 100  # every Nth engine step gets a trace of its own, linked to its requests; 0: none
    # plan and send step N+1 while the worker runs step N (it queues it), so the worker never waits for a round trip
    # or for the scheduler; false: one step at a time (the same outputs; for comparison and debugging)
    async_scheduling: bool = True
    late_planning: bool = field(default=True, metadata={"help": (
        "with async scheduling, while requests arrive: plan step N+1 shortly before step N ends rather than as it "
        "starts, so that arrivals meanwhile join N+1 (a step less of TTFT under load); false: always as N starts")})
    check_integrity_when_idle: bool = field(default=False, metadata={"help": (
        "debug: run the scheduler's full leak check (KV blocks, request states, open streams) whenever the engine "
        "loop goes idle; a failed check stops the loop")})
    loop: Loop = "uvloop"  # the event loop: uvloop or asyncio (the standard library's)
    log_level: LogLevel = "info"  # debug, info, warning, error

    def __post_init__(self) -> None:
        check_choices(self)
        check_not_placeholder("--internal-token", self.internal_token)
        if self.worker_tls and not self.tls.dials_tls:
            raise ValueError("--worker-tls needs --internal-tls-ca (the CA that signed the worker's certificate)")
        if self.scale_down.pod_deletion_cost and not self.state.redis_url:
            raise ValueError("--pod-deletion-cost needs --redis-url (the replicas' prefix indexes are compared there)")
        if self.drain_handoff_margin_s < 0:
            raise ValueError(f"drain_handoff_margin_s must not be negative, got {self.drain_handoff_margin_s}")
