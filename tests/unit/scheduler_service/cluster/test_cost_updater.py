"""The deletion cost updater against a real Redis and a fake API server: it patches its pod's annotation when the
cost changes and only then, publishes every round's ratio, and survives refusals and a Redis outage (logged,
retried with backoff, never raised)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest

from pagedserve.services.scheduler.cluster.config import PodDeletionCostConfig
from pagedserve.services.scheduler.cluster.cost_updater import DeletionCostUpdater, pod_patcher
from pagedserve.services.scheduler.cluster.deletion_cost import ANNOTATION
from pagedserve.shared.block_overlap import Overlap
from pagedserve.shared.redis_client import ReconnectBackoff, bounded_client
from pagedserve.shared.replica_keys import prefix_blocks_key
from tests.integration.processes import RedisServer
from tests.support.waiting import wait_for_async
from tests.unit.scheduler_service.cluster.fake_kube_api import FakeKubeAPI
from tests.unit.scheduler_service.cluster.test_pod_patcher import service_account

POD = "engine-5f7c9-abcde"


def patched_costs(api: FakeKubeAPI) -> list[str]:
    return [json.loads(r.body)["metadata"]["annotations"][ANNOTATION] for r in api.requests]


@pytest.mark.asyncio
async def test_patches_on_change_only_and_survives_refusals_and_a_redis_outage(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="pagedserve.services.scheduler.cluster.cost_updater")
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    sync = server.client()
    sync.sadd(prefix_blocks_key(POD), "01", "02", "03", "04")
    sync.sadd(prefix_blocks_key("engine-other"), "01")
    api = FakeKubeAPI(statuses=[500, 403])  # the first two patches are refused
    await api.start()
    config = PodDeletionCostConfig(pod_deletion_cost=True, pod_deletion_cost_interval_s=0.05,
                                   kubernetes_api_url=f"http://127.0.0.1:{api.port}",
                                   kubernetes_service_account_dir=str(service_account(tmp_path / "sa")))
    published: list[tuple[Overlap, int]] = []
    client = bounded_client(server.url, 1.0)
    updater = DeletionCostUpdater(config, POD, client, lambda: pod_patcher(config, POD),
                                  lambda overlap, cost: published.append((overlap, cost)),
                                  ReconnectBackoff(base_s=0.01, cap_s=0.05))
    task = asyncio.create_task(updater.run())
    try:
        await wait_for_async(lambda: updater.patched_cost == 750, timeout_s=30, what="the cost accepted")
        assert patched_costs(api) == ["750", "750", "750"]  # refused twice, retried
        assert api.requests[-1].path == f"/api/v1/namespaces/pagedserve/pods/{POD}"
        rounds = len(published)
        await wait_for_async(lambda: len(published) >= rounds + 5, timeout_s=30, what="five more rounds")
        assert len(api.requests) == 3  # the same cost is not patched again
        assert published[-1] == (Overlap(4, 3), 750)

        sync.sadd(prefix_blocks_key("engine-other"), "02", "03")  # now 3 of 4 blocks are held elsewhere
        await wait_for_async(lambda: updater.patched_cost == 250, timeout_s=30, what="the new cost patched")
        assert patched_costs(api)[3:] == ["250"]

        server.kill()  # Redis gone: rounds fail, the task goes on
        failures = updater.num_failures
        await wait_for_async(lambda: updater.num_failures >= failures + 3, timeout_s=30, what="failed rounds")
        assert not task.done()
        server.start()  # back, empty: this replica's cache is not published yet, removing it loses nothing
        await wait_for_async(lambda: updater.patched_cost == 0, timeout_s=30, what="the cost after the outage")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()
        await api.stop()
        server.kill()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(" (")[0] for r in warnings] == ["pod deletion cost not updated"] * 2
    assert "HTTP 500" in warnings[0].getMessage()  # one warning per run of failures, the rest at debug
    assert sum("updating again" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.asyncio
async def test_a_missing_namespace_is_a_failed_round_not_a_crash(tmp_path, caplog):
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    config = PodDeletionCostConfig(pod_deletion_cost=True, pod_deletion_cost_interval_s=0.05,
                                   kubernetes_api_url="http://127.0.0.1:9",
                                   kubernetes_service_account_dir=str(tmp_path / "no-service-account"))
    client = bounded_client(server.url, 1.0)
    updater = DeletionCostUpdater(config, POD, client, lambda: pod_patcher(config, POD))
    try:
        delay_s = await updater.update_once()
    finally:
        await client.aclose()
        server.kill()
    assert 0 < delay_s <= config.pod_deletion_cost_interval_s and updater.num_failures == 1
    assert "no pod namespace" in caplog.text


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="--pod-deletion-cost-interval-s must be positive"):
        PodDeletionCostConfig(pod_deletion_cost_interval_s=0)
