"""The gateway's mirror of a scheduler's prefix index follows the real publisher through a real redis-server: random
inserts and evictions, a Redis restart, a scheduler restart, and loads."""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from tests.integration.processes import RedisServer
from tests.support.tasks import cancelled_after, running
from tests.support.waiting import wait_for_async


async def eventually(condition, what: str = "condition") -> None:
    await wait_for_async(condition, timeout_s=30, interval_s=0.01, what=what)


def churn(index: PrefixIndex, rng: random.Random, num_changes: int) -> None:
    for _ in range(num_changes):
        key = rng.randrange(300).to_bytes(16, "little")
        if index.get(key) is None:
            index.insert(key, rng.randrange(1000))
        else:
            index.remove(key)


@pytest.mark.asyncio
async def test_the_mirror_equals_the_index_through_churn_and_restarts(tmp_path):
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    rng = random.Random(3)
    indexes = {"a": PrefixIndex(), "b": PrefixIndex()}
    config = RedisStateConfig(redis_url=server.url, redis_flush_interval_s=0.005, redis_stats_interval_s=0.02,
                              redis_prefix_sync_interval_s=0.005, redis_prefix_events_max=50, redis_timeout_s=0.5)
    loads = {"a": {"num_running": 3, "num_waiting": 1, "kv_usage": 0.5}, "b": {"num_running": 0, "num_waiting": 0}}
    writers = {name: RedisStateWriter(config, name, lambda n=name: loads[n], lambda n=name: indexes[n])
               for name in indexes}
    mirror = PrefixMirror(server.url, timeout_s=0.5, stats_interval_s=0.02, retry_interval_s=0.05)
    mirror.follow(["a", "b"])

    def mirrored(name: str) -> bool:
        view = mirror.view(name)
        return view is not None and view.keys == set(indexes[name].keys())

    try:
        async with running(writers["a"].run()), running(mirror.run()):
            old_b = asyncio.create_task(writers["b"].run())
            for _ in range(30):  # churn faster than the stream keeps (50 entries): the mirror must resync
                churn(indexes["a"], rng, 40)
                churn(indexes["b"], rng, 5)
                await asyncio.sleep(rng.choice([0, 0.002, 0.01]))
            await eventually(lambda: mirrored("a") and mirrored("b"), what="mirror equal to the indexes")
            await eventually(lambda: mirror.view("a").load is not None)
            assert (mirror.view("a").load.num_running, mirror.view("a").load.num_waiting) == (3, 1)

            server.kill()
            await eventually(lambda: not mirror.connected and mirror.view("a") is None, what="outage noticed")
            churn(indexes["a"], rng, 100)
            server.start()  # empty: everything comes back from the schedulers' snapshots
            await eventually(lambda: mirrored("a") and mirrored("b"), what="mirror equal after Redis returned")

            old_b.cancel()  # scheduler b restarts: a new writer (seq from 1) over a new, small index
            with contextlib.suppress(asyncio.CancelledError):
                await old_b
            writers["b"] = RedisStateWriter(config, "b", lambda: loads["b"], lambda: indexes["b"])
            indexes["b"] = PrefixIndex()
            indexes["b"].insert(b"\x07" * 16, 1)
            async with running(writers["b"].run()):
                await eventually(lambda: mirrored("b"), what="mirror equal after the scheduler restarted")
                churn(indexes["b"], rng, 20)
                await eventually(lambda: mirrored("b"))
    finally:
        server.kill()


@pytest.mark.asyncio
async def test_a_cancelled_mirror_always_stops(tmp_path):
    """redis-py lost about one cancel in sixteen of the XREAD loop (the gateway's shutdown then hung)."""
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    rng = random.Random(5)
    try:
        for _ in range(60):
            mirror = PrefixMirror(server.url, timeout_s=0.5, stats_interval_s=0.02, retry_interval_s=0.05)
            mirror.follow(["a", "b"])
            await cancelled_after(mirror.run(), rng.uniform(0.0, 0.3))
    finally:
        server.kill()
