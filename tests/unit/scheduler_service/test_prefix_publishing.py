"""The published prefix set equals the scheduler's real cache: after a randomized run with evictions, a Redis
outage in the middle and an engine restart (a new, empty index), against a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.prefix_publisher import PrefixPublisher
from pagedserve.services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from pagedserve.shared.replica_keys import DELTA, SNAPSHOT, PrefixEvent, prefix_blocks_key, prefix_events_key
from tests.integration.processes import RedisServer
from tests.support.fake_worker import describe
from tests.support.waiting import wait_for_async
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

INSTANCE = "publish-test"


def random_prompt(rng: random.Random, prefixes: list[list[int]]) -> list[int]:
    head = rng.choice(prefixes)[:rng.randrange(0, 40)]
    return head + [rng.randrange(1, 90) for _ in range(rng.randrange(1, 14))]


def run_steps(harness: Harness, rng: random.Random, prefixes: list[list[int]], num_steps: int, tag: str) -> None:
    for step in range(num_steps):
        if rng.random() < 0.5:
            harness.add(gen(f"{tag}-{step}", random_prompt(rng, prefixes), rng.choice([None, None, "salt"]),
                            max_tokens=rng.randrange(1, 6), ignore_eos=True))
        if harness.scheduler.has_unfinished_requests() or harness.scheduler.finished_req_ids:
            harness.step()


async def published_equals_cache(client, index: PrefixIndex) -> None:
    expected = {key.hex() for key in index.keys()}

    async def equal() -> bool:
        return await client.smembers(prefix_blocks_key(INSTANCE)) == expected

    await wait_for_async(equal, timeout_s=30, interval_s=0.02, what="the published set equal to the cache")


@pytest.mark.asyncio
async def test_published_set_matches_the_cache_through_evictions_outage_and_restart(tmp_path):
    import redis.asyncio as aioredis

    server = RedisServer(tmp_path / "redis.log")
    server.start()
    rng = random.Random(7)
    prefixes = [[rng.randrange(1, 90) for _ in range(40)] for _ in range(4)]
    harness = Harness(make_config(max_num_batched_tokens=24, max_num_seqs=4), describe(num_blocks=40))
    config = RedisStateConfig(redis_url=server.url, redis_flush_interval_s=0.005, redis_stats_interval_s=0.05,
                              redis_prefix_sync_interval_s=0.005, redis_timeout_s=0.5)
    writer = RedisStateWriter(config, INSTANCE, dict, lambda: harness.kv.prefix_index)
    task = asyncio.create_task(writer.run())
    client = aioredis.Redis(port=server.port, decode_responses=True)
    try:
        for round_index in range(6):
            for chunk in range(10):
                run_steps(harness, rng, prefixes, 8, f"r{round_index}c{chunk}")
                await asyncio.sleep(0.003)  # the writer publishes part-way, mid-run
            if round_index == 2:  # Redis dies; changes made meanwhile are lost to it
                server.kill()
                run_steps(harness, rng, prefixes, 60, "outage")
                await asyncio.sleep(0.05)
                server.start()
                await client.aclose()
                client = aioredis.Redis(port=server.port, decode_responses=True)
            if round_index == 4:  # the engine starts over with an empty cache (its worker was lost)
                harness.run()
                harness.scheduler = type(harness.scheduler)(harness.scheduler.config, harness.description)
            await published_equals_cache(client, harness.kv.prefix_index)
        assert harness.kv.prefix_index.counters.num_evictions > 50, "the run should evict cached blocks"
        assert len(harness.kv.prefix_index) > 5
        entries = await client.xrange(prefix_events_key(INSTANCE))
        events = [PrefixEvent.from_fields(fields) for _, fields in entries]
        assert [e.seq for e in events] == sorted({e.seq for e in events}), "seq must increase"
        assert {e.op for e in events} == {SNAPSHOT, DELTA}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()
        server.kill()


def test_deltas_net_each_key_to_its_last_change_and_a_lost_publish_forces_a_snapshot():
    index = PrefixIndex()
    index.insert(b"\x01", 1)
    publisher = PrefixPublisher(lambda: index)
    event, members = publisher.next_event()
    assert event == PrefixEvent(1, SNAPSHOT) and members == ["01"]
    assert publisher.next_event() is None
    index.insert(b"\x02", 2)
    index.remove(b"\x02")  # added and evicted between two publishes
    index.remove(b"\x01")
    index.insert(b"\x01", 3)  # evicted and cached again
    index.insert(b"\x03", 4)
    event, members = publisher.next_event()
    assert event == PrefixEvent(2, DELTA, added=("01", "03"), removed=("02",)) and members == []
    publisher.lost()
    event, members = publisher.next_event()
    assert event.op == SNAPSHOT and event.seq == 3 and sorted(members) == ["01", "03"]


def test_a_journal_overflow_forces_a_snapshot():
    index = PrefixIndex()
    publisher = PrefixPublisher(lambda: index, journal_limit=3)
    assert publisher.next_event()[0].op == SNAPSHOT
    for block_id in range(5):
        index.insert(bytes([block_id]), block_id)
    event, members = publisher.next_event()
    assert event.op == SNAPSHOT and len(members) == 5
    index.insert(b"\x09", 9)
    assert publisher.next_event()[0] == PrefixEvent(3, DELTA, added=("09",))


def test_a_snapshot_goes_out_every_interval_even_without_trouble():
    index = PrefixIndex()
    publisher = PrefixPublisher(lambda: index, snapshot_interval_s=0.05)
    assert publisher.next_event()[0].op == SNAPSHOT
    index.insert(b"\x01", 1)
    assert publisher.next_event()[0].op == DELTA
    time.sleep(0.06)
    index.insert(b"\x02", 2)
    event, members = publisher.next_event()
    assert event.op == SNAPSHOT and sorted(members) == ["01", "02"]
