"""Keeps this pod's deletion cost equal to its cache's duplication: a background task of the scheduler process.

Contract: every `pod_deletion_cost_interval_s` it computes this replica's Overlap in Redis (own_overlap.py), hands
it and its cost (deletion_cost.py) to `publish` (the scheduler's /metrics), and PATCHes the pod's annotation when
the cost differs from the last one the API server accepted (the first round always patches). A failed round
(Redis or the API server unreachable, refused, slow) is logged (a warning at the first failure of a run of them,
then debug; info when it recovers) and retried after an exponential backoff with jitter, capped at the interval;
nothing raises out of run() but a cancel, so the scheduler never stops for it. Never on the engine step's path: it
awaits only Redis and the API server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.services.scheduler.cluster.config import PodDeletionCostConfig
from pagedserve.services.scheduler.cluster.deletion_cost import ANNOTATION, deletion_cost
from pagedserve.services.scheduler.cluster.own_overlap import own_overlap
from pagedserve.services.scheduler.cluster.pod_patcher import PatchFailed, PodPatcher, PodRef, namespace_of
from pagedserve.shared.block_overlap import Overlap
from pagedserve.shared.redis_client import ReconnectBackoff

log = logging.getLogger(__name__)


def pod_patcher(config: PodDeletionCostConfig, instance_id: str) -> PodPatcher:
    """The patcher of this pod: --pod-name (else the instance id) in --pod-namespace (else the service account's)."""
    namespace = config.pod_namespace or namespace_of(config.kubernetes_service_account_dir)
    return PodPatcher(config.kubernetes_api_url, config.kubernetes_service_account_dir,
                      PodRef(namespace, config.pod_name or instance_id))


@dataclass
class DeletionCostUpdater:
    config: PodDeletionCostConfig
    instance_id: str
    redis: aioredis.Redis
    patcher_source: Callable[[], PodPatcher]  # built at the first round (a missing namespace file is a failed round)
    publish: Callable[[Overlap, int], None] = lambda overlap, cost: None
    backoff: ReconnectBackoff = field(default_factory=lambda: ReconnectBackoff(base_s=1.0, cap_s=60.0))
    patched_cost: int | None = None  # the last cost the API server accepted
    num_patches: int = 0
    num_failures: int = 0
    _patcher: PodPatcher | None = None
    _failing: bool = False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(await self.update_once())

    async def update_once(self) -> float:
        """One round; the seconds to wait before the next."""
        try:
            overlap = await own_overlap(self.redis, self.instance_id)
            cost = deletion_cost(overlap)
            self.publish(overlap, cost)
            if cost != self.patched_cost:
                await self._patch(cost)
        except (RedisError, OSError, TimeoutError, PatchFailed) as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug here must not stop the scheduler: log it whole, keep trying
            log.exception("pod deletion cost: unexpected error")
            return self._failed(f"{type(exc).__name__}: {exc}")
        if self._failing:
            log.info("pod deletion cost: updating again (%d failed rounds so far)", self.num_failures)
        self._failing = False
        self.backoff.reset()
        return self.config.pod_deletion_cost_interval_s

    async def _patch(self, cost: int) -> None:
        if self._patcher is None:
            self._patcher = self.patcher_source()
        await self._patcher.set_annotation(ANNOTATION, str(cost))
        self.patched_cost = cost
        self.num_patches += 1
        log.debug("pod deletion cost of %s set to %d", self._patcher.pod.name, cost)

    def _failed(self, reason: str) -> float:
        self.num_failures += 1
        delay_s = min(self.backoff.next_delay_s(), self.config.pod_deletion_cost_interval_s)
        log.log(logging.DEBUG if self._failing else logging.WARNING,
                "pod deletion cost not updated (%s); retrying in %.1f s", reason, delay_s)
        self._failing = True
        return delay_s
