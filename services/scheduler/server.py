"""Runs the scheduler process: gRPC server first (health NOT_SERVING), then the worker, the loop and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.ports import GRPC_SERVER_OPTIONS, bind_grpc_port
from services.proto_gen import scheduler_pb2_grpc
from services.scheduler.engine_loop import EngineLoop
from services.scheduler.redis_state import RedisStateWriter
from services.scheduler.scheduler import Scheduler
from services.scheduler.service import SchedulerServicer
from services.scheduler.service_config import SchedulerServiceConfig
from services.scheduler.worker_client import WorkerClient

log = logging.getLogger(__name__)
SERVICE_NAME = "pagedserve.v1.SchedulerService"


async def _set_serving(health_servicer: health.aio.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, status)


async def _start_engine(config: SchedulerServiceConfig, servicer: SchedulerServicer, worker: WorkerClient,
                        health_servicer: health.aio.HealthServicer, stop: asyncio.Event,
                        tasks: list[asyncio.Task]) -> None:
    """Wait for the worker, then start the loop (and the Redis writer) into `tasks` and report SERVING."""
    description = await worker.wait_until_ready()
    engine = EngineLoop(Scheduler(config.scheduler, description), worker, servicer.state)
    tasks.append(asyncio.create_task(_run_engine(engine, stop), name="engine-loop"))
    if config.state.redis_url:
        instance_id = config.instance_id or f"{socket.gethostname()}-{config.scheduler_port}"
        writer = RedisStateWriter(config.state, instance_id, lambda: _redis_stats(engine),
                                  lambda: engine.scheduler.kv.prefix_index.keys())
        engine.state = servicer.state = writer
        tasks.append(asyncio.create_task(writer.run(), name="redis-writer"))
        log.info("Redis state copy at %s under pagedserve:%s:*", config.state.redis_url, instance_id)
    servicer.engine = engine
    await _set_serving(health_servicer, True)
    policy = config.scheduler
    log.info("scheduler ready: %s, %d KV blocks of %d tokens, context %d; max_num_seqs %d, "
             "max_num_batched_tokens %d, prefix caching %s, chunked prefill %s", description.model_name,
             description.num_kv_blocks, description.block_size, description.max_model_len, policy.max_num_seqs,
             policy.max_num_batched_tokens, _on_off(policy.enable_prefix_caching),
             _on_off(policy.enable_chunked_prefill))


def _on_off(enabled: bool) -> str:
    return "on" if enabled else "off"


async def _run_engine(engine: EngineLoop, stop: asyncio.Event) -> None:
    """A crashed loop stops the process (health goes NOT_SERVING) rather than serving nothing."""
    try:
        await engine.run()
    except Exception:
        log.exception("the engine loop crashed; stopping")
        stop.set()
        raise


def _redis_stats(engine: EngineLoop) -> dict:
    scheduler = engine.scheduler
    return {"kv_usage": scheduler.kv.usage, "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting), "num_kv_blocks": scheduler.worker.num_kv_blocks}


async def serve(config: SchedulerServiceConfig) -> None:
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    servicer = SchedulerServicer()
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    await _set_serving(health_servicer, False)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    address = f"{config.scheduler_host}:{config.scheduler_port}"
    bind_grpc_port(server, config.scheduler_host, config.scheduler_port, "the scheduler's gRPC server",
                   "--scheduler-port")
    await server.start()
    log.info("scheduler gRPC on %s; worker at %s", address, config.worker_address)

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    worker = WorkerClient(config.worker_address, config.worker_step_timeout_s)
    tasks: list[asyncio.Task] = []
    startup = asyncio.create_task(_start_engine(config, servicer, worker, health_servicer, stop, tasks))
    startup.add_done_callback(lambda task: task.cancelled() or task.exception() is None or stop.set())
    await stop.wait()
    log.info("stopping (grace %.1fs)", config.grace_period_s)
    await _set_serving(health_servicer, False)
    await server.stop(config.grace_period_s)  # streams in flight finish while the engine still runs
    for task in [startup, *tasks]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await worker.close()
    log.info("scheduler stopped")
