"""`python -m services.healthcheck` (the compose health checks) against real gRPC health and HTTP servers."""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.healthcheck import main


@pytest.fixture
def grpc_health():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def test_grpc_serving_is_healthy(grpc_health) -> None:
    servicer, address = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["grpc", address]) == 1
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert main(["grpc", address]) == 0


def test_nothing_listening_is_unhealthy(grpc_health) -> None:
    _, address = grpc_health
    assert main(["grpc", "127.0.0.1:1", "--timeout-s", "0.5"]) == 1
    assert main(["http", "http://127.0.0.1:1/health", "--timeout-s", "0.5"]) == 1


def test_http_200_is_healthy() -> None:
    status = {"code": 503}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status["code"])
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    try:
        assert main(["http", url]) == 1
        status["code"] = 200
        assert main(["http", url]) == 0
    finally:
        server.shutdown()
