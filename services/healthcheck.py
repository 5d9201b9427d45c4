"""`python -m pagedserve.services.healthcheck grpc HOST:PORT [--service NAME]` or `... http URL`: exit 0 when the
service
reports itself healthy (gRPC health SERVING, or HTTP 200), 1 otherwise. For container health checks
(docker-compose.yml); on Kubernetes the kubelet's own gRPC and HTTP probes do the same.

gRPC service "" is a process's liveness; pagedserve.v1.SchedulerService / pagedserve.v1.WorkerService its
readiness. `... model DIR --wait-s N` waits until a model folder is complete (an init container's job);
`... grpc HOST:PORT --wait-gone-s N` waits until nothing answers there any more (a preStop hook that keeps a
worker up while its scheduler drains), and exits 0 either way."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.internal_tls import InternalTLSConfig, sync_channel
from pagedserve.shared.default_model import is_complete


def grpc_serving(address: str, timeout_s: float, service: str = "", tls: InternalTLSConfig | None = None) -> bool:
    """True when the server at `address` reports `service` SERVING ("": liveness, the process as a whole); over
    TLS when `tls` dials it."""
    with sync_channel(address, tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=timeout_s)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def http_ok(url: str, timeout_s: float) -> bool:
    try:
        return httpx.get(url, timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def model_complete(model_dir: str, wait_s: float, interval_s: float = 2.0) -> bool:
    """Whether the folder holds a complete model, waiting up to `wait_s` for it (written by another container)."""
    deadline_s = time.monotonic() + wait_s
    while not is_complete(Path(model_dir)):
        if time.monotonic() >= deadline_s:
            return False
        time.sleep(interval_s)
    return True


def wait_gone(address: str, wait_s: float, interval_s: float = 1.0) -> None:
    """Return once `address` stops answering gRPC health (or after `wait_s`)."""
    deadline_s = time.monotonic() + wait_s
    while time.monotonic() < deadline_s and _answers(address, min(interval_s, 3.0)):
        time.sleep(interval_s)


def _answers(address: str, timeout_s: float) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            return exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.services.healthcheck",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("grpc", "http", "model"))
    parser.add_argument("target", help="HOST:PORT (grpc), URL (http) or a model folder (model)")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--service", default="", help="gRPC health service name ('' = liveness)")
    parser.add_argument("--wait-s", type=float, default=0.0, help="model: how long to wait for the folder")
    parser.add_argument("--wait-gone-s", type=float, default=None,
                        help="grpc: wait up to this long until the target stops answering, then exit 0")
    args = parser.parse_args(argv)
    if args.kind == "grpc" and args.wait_gone_s is not None:
        wait_gone(args.target, args.wait_gone_s)
        print(f"{args.target}: gone")
        return 0
    if args.kind == "grpc":
        healthy = grpc_serving(args.target, args.timeout_s, args.service)
    elif args.kind == "http":
        healthy = http_ok(args.target, args.timeout_s)
    else:
        healthy = model_complete(args.target, args.wait_s)
    print(f"{args.target}: {'healthy' if healthy else 'unhealthy'}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
