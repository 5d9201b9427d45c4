"""A scheduler whose worker is not there yet: alive (health "") but not ready (its named service NOT_SERVING),
UNAVAILABLE to Generate, /metrics answering, clean SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.ports import free_port
from pagedserve.services.proto_convert.scheduler_contract import generate_request_to_pb
from pagedserve.services.proto_gen import scheduler_pb2_grpc
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.integration.processes import REPO, wait_for


def test_scheduler_waits_for_its_worker_and_says_so(tmp_path):
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path / "scheduler.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "pagedserve.services.scheduler", "--scheduler-port",
                                    str(port),
                                    "--worker-address", f"127.0.0.1:{free_port()}", "--metrics-port",
                                    str(metrics_port)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        health = health_pb2_grpc.HealthStub(channel)

        def status(service: str = "pagedserve.v1.SchedulerService"):
            try:
                return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status
            except grpc.RpcError:
                return None

        assert wait_for(status, 30, interval_s=0.2, what="scheduler health") == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        # liveness does not follow the worker: a kubelet must not restart a scheduler that waits for its worker
        assert status("") == health_pb2.HealthCheckResponse.SERVING
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).status_code == 200
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        request = generate_request_to_pb(GenerateRequest("early", [1, 2, 3], SamplingParams()))
        try:
            list(stub.Generate(request, timeout=5))
            raise AssertionError("Generate succeeded without a worker")
        except grpc.RpcError as exc:
            assert exc.code() is grpc.StatusCode.UNAVAILABLE and "waiting for its worker" in exc.details()
        channel.close()
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(15)
    assert code == 0, log_path.read_text()
