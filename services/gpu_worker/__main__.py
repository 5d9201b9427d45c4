"""`python -m pagedserve.services.gpu_worker MODEL_DIR [flags]`: serve one device's model and KV cache over gRPC."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence

import grpc

from pagedserve.services.gpu_worker.server import WorkerServicer, build_server, health_only_server, set_serving
from pagedserve.services.gpu_worker.service_config import WorkerServiceConfig
from pagedserve.services.internal_tls import server_credentials
from pagedserve.shared.cli_config import parse_config
from pagedserve.shared.log_setup import setup_logging
from pagedserve.shared.model_dir import model_dir_problem
from pagedserve.shared.tracing import setup_tracing, shutdown_tracing

log = logging.getLogger("pagedserve.worker")
QUIET_S = 1.0  # a draining worker stops once no step came for this long
STEP_GRACE_S = 5.0  # for a step still running when the server stops


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    config = parse_config(WorkerServiceConfig, argv, __doc__, prog=prog, positional=("model_dir",))
    problem = model_dir_problem(config.worker.model_dir, weights=config.worker.load_format != "dummy",
                                tokenizer=False)
    draft_dir = config.worker.draft_model_dir
    if problem is None and draft_dir is not None:
        problem = model_dir_problem(draft_dir, weights=config.worker.load_format != "dummy", tokenizer=False)
        problem = problem and f"the speculative config's draft model: {problem}"
    if problem is not None:
        print(f"{prog or 'worker'}: error: {problem}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    servicer = WorkerServicer()
    try:
        server, health_servicer = build_server(servicer, config.worker_host, config.worker_port, config.internal_token,
                                               server_credentials(config.tls) if config.worker_tls else None)
        health_server = health_only_server(health_servicer, config.worker_host, config.worker_health_port) \
            if config.worker_health_port else None
    except OSError as exc:  # a port in use, or an address not of this machine: one line, not a traceback
        log.error("%s", exc)
        return 2
    setup_tracing("pagedserve-worker")
    server.start()
    if health_server is not None:
        health_server.start()
    log.info("worker gRPC on %s:%d (%s); loading %s", config.worker_host, config.worker_port,
             "TLS" if config.worker_tls else "plaintext", config.worker.model_dir)

    stopping = threading.Event()

    def stop(signum, frame) -> None:
        log.info("signal %d: draining (readiness NOT_SERVING; steps go on until the scheduler stops sending them, "
                 "up to %.0fs)", signum, config.drain_timeout_s)
        set_serving(health_servicer, False)
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    from pagedserve.services.gpu_worker.model_config import (
        UnsupportedModelError,  # imports torch: after the port is bound
    )

    try:
        servicer.load(config.worker)
    except UnsupportedModelError as exc:  # the operator's choice of model or flags: one line, not a traceback
        log.error("cannot serve %s: %s", config.worker.model_dir, exc)
        _stop(server, health_server, 0)
        return 2
    except Exception:
        log.exception("failed to load the model")
        _stop(server, health_server, 0)
        return 1
    description = servicer.worker.describe()
    problem = description.pool_problem()
    if problem is not None:  # refused at start, not "ready" and then refusing every long request
        log.error("%s", problem)
        _stop(server, health_server, 0)
        return 2
    if not stopping.is_set():
        set_serving(health_servicer, True)
    log.info("worker ready: %s on %s, %d KV blocks of %d tokens (%.0f MiB), attention %s, incarnation %s",
             description.model_name, description.device, description.num_kv_blocks, description.block_size,
             description.kv_cache_bytes / 1024**2, description.attention_backend, description.incarnation_id)
    while not stopping.wait(0.5):
        pass
    _drain(servicer, config.drain_timeout_s)
    _stop(server, health_server, STEP_GRACE_S)
    shutdown_tracing()
    log.info("worker stopped")
    return 0


def _stop(server: grpc.Server, health_server: grpc.Server | None, grace_s: float) -> None:
    server.stop(grace_s).wait()
    if health_server is not None:
        health_server.stop(0).wait()


def _drain(servicer: WorkerServicer, timeout_s: float) -> None:
    """Serve steps until none came for QUIET_S (the scheduler finished its requests or is gone) or the timeout."""
    deadline_s = time.monotonic() + timeout_s
    while servicer.idle_for_s() < QUIET_S and time.monotonic() < deadline_s:
        time.sleep(0.1)
    log.info("drained: no step for %.1fs", servicer.idle_for_s())


if __name__ == "__main__":
    sys.exit(main())
