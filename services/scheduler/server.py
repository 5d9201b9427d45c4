"""Runs the scheduler process: gRPC server and /metrics first, then the worker, the loop and Redis.

Health: service "" is liveness (SERVING while the process and its loop run, whatever the worker does); the named
service pagedserve.v1.SchedulerService is readiness and follows `Readiness` (waiting for the worker, worker lost,
hung or not serving, draining). On SIGTERM the scheduler drains (services/scheduler/drain.py) before it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.grpc_errors import RequestFailed
from pagedserve.services.internal_auth import AsyncTokenInterceptor
from pagedserve.services.internal_tls import server_credentials
from pagedserve.services.ports import GRPC_SERVER_OPTIONS, PortInUseError, bind_grpc_port, port_is_free
from pagedserve.services.proto_gen import scheduler_pb2_grpc
from pagedserve.services.scheduler.admission import AdmissionControl
from pagedserve.services.scheduler.cluster.cost_updater import DeletionCostUpdater, pod_patcher
from pagedserve.services.scheduler.drain import drain
from pagedserve.services.scheduler.engine_loop import EngineLoop
from pagedserve.services.scheduler.metrics import SchedulerMetrics
from pagedserve.services.scheduler.metrics_server import start_metrics_server
from pagedserve.services.scheduler.readiness import NotReady, Readiness
from pagedserve.services.scheduler.redis_state import RedisStateWriter
from pagedserve.services.scheduler.request_observer import RequestObserver
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.service import SchedulerServicer
from pagedserve.services.scheduler.service_config import SchedulerServiceConfig
from pagedserve.services.scheduler.worker_client import WorkerClient
from pagedserve.services.scheduler.worker_monitor import WorkerMonitor
from pagedserve.shared.redis_client import bounded_client
from pagedserve.shared.redis_url import masked_url
from pagedserve.shared.scheduler_stats import redis_fields

log = logging.getLogger(__name__)
SERVICE_NAME = "pagedserve.v1.SchedulerService"


FLUSH_GRACE_S = 5.0  # after the drain, for the last chunks to leave
_SERVING, _NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def _publish_readiness(readiness: Readiness, health_servicer: health.aio.HealthServicer) -> None:
    """Keep the readiness health status equal to `readiness`, in the order it changed."""
    while True:
        ready = await readiness.wait_changed()
        await health_servicer.set(SERVICE_NAME, _SERVING if ready else _NOT_SERVING)
        log.log(logging.INFO if ready else logging.WARNING, "readiness: %s",
                "SERVING" if ready else f"NOT_SERVING ({readiness.reason})")


async def _start_engine(config: SchedulerServiceConfig, servicer: SchedulerServicer, worker: WorkerClient,
                        metrics: SchedulerMetrics, readiness: Readiness, stop: asyncio.Event,
                        tasks: list[asyncio.Task]) -> None:
    """Wait for the worker, then start the loop, its worker monitor (and the Redis writer) into `tasks`."""
    description = await worker.wait_until_ready()
    engine = EngineLoop(Scheduler(config.scheduler, description), worker, servicer.state,
                        RequestObserver(metrics, description.model_name), config.trace_step_interval, readiness,
                        AdmissionControl(config.admission), config.async_scheduling, config.late_planning,
                        config.check_integrity_when_idle)
    tasks.append(asyncio.create_task(_run_engine(engine, stop), name="engine-loop"))
    monitor = WorkerMonitor(worker, engine, config.worker_probe_interval_s, config.worker_probe_timeout_s)
    tasks.append(asyncio.create_task(monitor.run(), name="worker-monitor"))
    if config.state.redis_url:
        writer = RedisStateWriter(config.state, servicer.instance_id, lambda: redis_fields(servicer.snapshot(engine)),
                                  lambda: engine.scheduler.kv.prefix_index)
        engine.state = servicer.state = writer
        tasks.append(asyncio.create_task(writer.run(), name="redis-writer"))
        log.info("Redis state copy at %s under pagedserve:%s:*", masked_url(config.state.redis_url),
                 servicer.instance_id)
    if config.scale_down.pod_deletion_cost:
        tasks.append(asyncio.create_task(_update_deletion_cost(config, servicer.instance_id, metrics,
                                                               description.model_name), name="pod-deletion-cost"))
    servicer.engine = engine
    readiness.set(NotReady.STARTING, False)
    policy = config.scheduler
    log.info("scheduler ready: %s, %d KV blocks of %d tokens, context %d, worker incarnation %s; max_num_seqs %d, "
             "max_num_batched_tokens %d, prefix caching %s, chunked prefill %s", description.model_name,
             description.num_kv_blocks, description.block_size, description.max_model_len,
             description.incarnation_id, policy.max_num_seqs, policy.max_num_batched_tokens,
             _on_off(policy.enable_prefix_caching), _on_off(policy.enable_chunked_prefill))


async def _update_deletion_cost(config: SchedulerServiceConfig, instance_id: str, metrics: SchedulerMetrics,
                                model_name: str) -> None:
    """This pod's deletion cost kept current (services/scheduler/cluster), with its own Redis connection."""
    client = bounded_client(config.state.redis_url, config.state.redis_timeout_s)
    updater = DeletionCostUpdater(config.scale_down, instance_id, client, lambda: pod_patcher(config.scale_down,
                                  instance_id), lambda overlap, cost: metrics.set_overlap(model_name, overlap, cost))
    log.info("pod deletion cost: updated every %.0f s through %s", config.scale_down.pod_deletion_cost_interval_s,
             config.scale_down.kubernetes_api_url)
    try:
        await updater.run()
    finally:
        await client.aclose()


def _on_off(enabled: bool) -> str:
    return "on" if enabled else "off"


async def _run_engine(engine: EngineLoop, stop: asyncio.Event) -> None:
    """A crashed loop stops the process (health goes NOT_SERVING) rather than serving nothing."""
    try:
        await engine.run()
    except Exception:
        log.exception("the engine loop crashed; stopping")
        engine.fail_all(RequestFailed("the scheduler's engine loop crashed"))
        stop.set()
        raise


def _stats_source(servicer: SchedulerServicer):
    """(snapshot, model name) for /metrics once the worker described itself, else None."""
    engine = servicer.engine
    return None if engine is None else (servicer.snapshot(engine), engine.scheduler.description.model_name)


def _spec_source(servicer: SchedulerServicer):
    """(speculative decoding counters, model name) while the live scheduler speculates, else None."""
    engine = servicer.engine
    if engine is None or engine.scheduler.drafts is None:
        return None
    return engine.scheduler.drafts.counters, engine.scheduler.description.model_name


def instance_id_of(config: SchedulerServiceConfig) -> str:
    """--instance-id, else hostname-port (unique per host; a Kubernetes pod's hostname is its name)."""
    return config.instance_id or f"{socket.gethostname()}-{config.scheduler_port}"


def health_only_server(config: SchedulerServiceConfig, health_servicer: health.aio.HealthServicer
                       ) -> grpc.aio.Server | None:
    """A plaintext server of gRPC health alone on --health-port (None without one): probes that cannot speak TLS
    see the same liveness and readiness as the gRPC port, and nothing else."""
    if not config.health_port:
        return None
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bind_grpc_port(server, config.scheduler_host, config.health_port, "the scheduler's health server",
                   "--health-port")
    return server


async def serve(config: SchedulerServiceConfig) -> None:
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS, interceptors=[AsyncTokenInterceptor(config.internal_token)])
    servicer = SchedulerServicer(instance_id_of(config), bool(config.state.redis_url))
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    await health_servicer.set("", _SERVING)
    await health_servicer.set(SERVICE_NAME, _NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{config.scheduler_host}:{config.scheduler_port}"
    bind_grpc_port(server, config.scheduler_host, config.scheduler_port, "the scheduler's gRPC server",
                   "--scheduler-port", server_credentials(config.tls))
    health_server = health_only_server(config, health_servicer)
    metrics = SchedulerMetrics(lambda: _stats_source(servicer), lambda: _spec_source(servicer))
    metrics_runner = None
    if config.metrics_port:
        try:
            metrics_runner = await start_metrics_server(config.metrics_host, config.metrics_port, metrics.render)
        except OSError:
            if not port_is_free(config.metrics_host, config.metrics_port):
                raise PortInUseError(config.metrics_host, config.metrics_port, "the scheduler's /metrics",
                                     "--metrics-port") from None
            raise
    await server.start()
    if health_server is not None:
        await health_server.start()
    log.info("scheduler gRPC on %s (%s); worker at %s (%s); /metrics on %s", address,
             "TLS" if config.tls.serves_tls else "plaintext", config.worker_address,
             "TLS" if config.worker_tls else "plaintext",
             f"{config.metrics_host}:{config.metrics_port}" if config.metrics_port else "(off)")

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    worker = WorkerClient(config.worker_address, config.step_progress_timeout_s, config.internal_token,
                          config.tls if config.worker_tls else None)
    readiness = Readiness(NotReady.STARTING)
    tasks = [asyncio.create_task(_publish_readiness(readiness, health_servicer), name="readiness")]
    startup = asyncio.create_task(_start_engine(config, servicer, worker, metrics, readiness, stop, tasks))
    startup.add_done_callback(lambda task: task.cancelled() or task.exception() is None or stop.set())
    await stop.wait()
    await drain(servicer.engine, readiness, config.drain_timeout_s, config.drain_handoff_margin_s)
    await health_servicer.set(SERVICE_NAME, _NOT_SERVING)
    await server.stop(FLUSH_GRACE_S)  # the streams' last chunks (or errors) reach the gateway
    if health_server is not None:
        await health_server.stop(0)
    for task in [startup, *tasks]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await worker.close()
    if metrics_runner is not None:
        await metrics_runner.cleanup()
    log.info("scheduler stopped")
