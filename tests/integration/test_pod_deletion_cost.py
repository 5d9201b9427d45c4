"""A real scheduler process with --pod-deletion-cost (a fake gRPC worker, a real Redis, a fake Kubernetes API):
it patches its own pod's deletion cost, retrying a refused patch, exports the ratio on its /metrics, and keeps
serving its health meanwhile."""

from __future__ import annotations

import json
import signal
import sys

import httpx
import pytest

from pagedserve.services.ports import free_port
from pagedserve.services.scheduler.cluster.deletion_cost import ANNOTATION
from pagedserve.shared.replica_keys import prefix_blocks_key
from tests.integration.processes import RedisServer
from tests.support.service_process import ServiceProcess, service_env
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.cluster.fake_kube_api import FakeKubeAPI
from tests.unit.scheduler_service.cluster.test_pod_patcher import service_account
from tests.unit.scheduler_service.test_step_deadline import DeadlockingWorker, worker_server


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.asyncio
async def test_the_scheduler_patches_its_pod_and_exports_the_ratio(tmp_path):
    redis_server = RedisServer(tmp_path / "redis.log")
    redis_server.start()
    redis_server.client().sadd(prefix_blocks_key("engine-other"), "aa", "bb")
    api = FakeKubeAPI(statuses=[503])  # the first patch is refused
    await api.start()
    metrics_port = free_port()
    async with worker_server(DeadlockingWorker()) as worker_address:
        scheduler = ServiceProcess("scheduler", [
            sys.executable, "-m", "pagedserve.services.scheduler", "--scheduler-port", str(free_port()),
            "--worker-address", worker_address, "--instance-id", "engine-7c9d-q2x", "--redis-url", redis_server.url,
            "--metrics-port", str(metrics_port), "--pod-deletion-cost", "--pod-deletion-cost-interval-s", "0.2",
            "--kubernetes-api-url", f"http://127.0.0.1:{api.port}",
            "--kubernetes-service-account-dir", str(service_account(tmp_path / "sa"))],
            tmp_path / "scheduler.log", service_env(PAGEDSERVE_POD_NAME="engine-7c9d-q2x")).start()
        try:
            async def exported() -> float | None:
                assert scheduler.running, scheduler.log_tail()
                try:
                    async with httpx.AsyncClient() as client:
                        text = (await client.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)).text
                except httpx.HTTPError:
                    return None
                cost = metric(text, "pagedserve_pod_deletion_cost")
                return None if cost is None or len(api.requests) < 2 else metric(
                    text, "pagedserve_replica_duplicated_blocks_ratio")

            ratio = await wait_for_async(exported, timeout_s=120, interval_s=0.2, what="the cost patched and exported")
        finally:
            scheduler.signal(signal.SIGTERM)
            exit_code = scheduler.wait(60)
            await api.stop()
            redis_server.kill()
    assert ratio == 1.0  # its own cache is empty: removing it loses nothing
    refused, accepted = api.requests[:2]
    assert refused.body == accepted.body and json.loads(accepted.body) == {"metadata": {"annotations": {
        ANNOTATION: "0"}}}
    assert accepted.path == "/api/v1/namespaces/pagedserve/pods/engine-7c9d-q2x"
    assert accepted.headers["Authorization"] == "Bearer token-1"
    assert "pod deletion cost not updated" in scheduler.log() and "HTTP 503" in scheduler.log()
    assert exit_code == 0, scheduler.log_tail()
