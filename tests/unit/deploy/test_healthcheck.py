"""`python -m pagedserve.services.healthcheck` (the compose health checks) against real gRPC health and HTTP servers."""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pagedserve.services.healthcheck import main
from pagedserve.shared.default_model import REQUIRED_FILES


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


def test_grpc_named_service_is_readiness(grpc_health) -> None:
    servicer, address = grpc_health
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("pagedserve.v1.WorkerService", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert main(["grpc", address]) == 0
    assert main(["grpc", address, "--service", "pagedserve.v1.WorkerService"]) == 1
    servicer.set("pagedserve.v1.WorkerService", health_pb2.HealthCheckResponse.SERVING)
    assert main(["grpc", address, "--service", "pagedserve.v1.WorkerService"]) == 0


def test_model_folder_is_healthy_once_complete(tmp_path) -> None:
    folder = tmp_path / "model"
    assert main(["model", str(folder)]) == 1
    folder.mkdir()
    for name in REQUIRED_FILES[:-1]:
        (folder / name).write_text("{}")
    assert main(["model", str(folder), "--wait-s", "0.1"]) == 1  # the weights are still missing
    threading.Timer(0.2, lambda: (folder / REQUIRED_FILES[-1]).write_bytes(b"w")).start()
    assert main(["model", str(folder), "--wait-s", "30"]) == 0


def test_wait_gone_returns_once_the_server_stops(grpc_health) -> None:
    import time

    _, address = grpc_health
    start_s = time.monotonic()
    assert main(["grpc", address, "--wait-gone-s", "0.5"]) == 0  # still answering: waits the whole time
    assert time.monotonic() - start_s >= 0.5
    start_s = time.monotonic()
    assert main(["grpc", "127.0.0.1:1", "--wait-gone-s", "30"]) == 0  # nothing there: at once
    assert time.monotonic() - start_s < 10
