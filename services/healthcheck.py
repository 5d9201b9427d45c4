"""`python -m services.healthcheck grpc HOST:PORT` or `... http URL`: exit 0 when the service reports itself
healthy (gRPC health SERVING, or HTTP 200), 1 otherwise. For container health checks (docker-compose.yml); on
Kubernetes the kubelet's own gRPC and HTTP probes do the same."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc


def grpc_serving(address: str, timeout_s: float, service: str = "") -> bool:
    """True when the server at `address` reports `service` SERVING ("": the server as a whole)."""
    with grpc.insecure_channel(address) as channel:
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.healthcheck", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("grpc", "http"))
    parser.add_argument("target", help="HOST:PORT (grpc) or URL (http)")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    check = grpc_serving if args.kind == "grpc" else http_ok
    healthy = check(args.target, args.timeout_s)
    print(f"{args.target}: {'healthy' if healthy else 'unhealthy'}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
