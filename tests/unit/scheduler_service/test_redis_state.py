"""The Redis writer never blocks or raises on the hot path: with Redis unreachable it drops and counts."""

from __future__ import annotations

import random
import socket

import pytest

from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from tests.integration.processes import RedisServer
from tests.support.tasks import cancelled_after, running
from tests.support.waiting import wait_for_async


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


@pytest.mark.asyncio
async def test_unreachable_redis_drops_counts_and_keeps_going():
    config = RedisStateConfig(redis_url=f"redis://127.0.0.1:{closed_port()}/0", redis_flush_interval_s=0.01,
                              redis_stats_interval_s=0.01, redis_timeout_s=0.2)
    index = PrefixIndex()
    index.insert(b"\x01\x02", 0)
    writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, lambda: index)
    async with running(writer.run()) as task:
        for i in range(5):
            writer.request_arrived(f"r{i}", 3, 0.0)
            writer.request_finished(f"r{i}", "stop", 1, 0)
        await wait_for_async(lambda: writer.num_dropped >= 10 or task.done(), what="the writes dropped")
        assert not task.done(), "the writer must survive Redis being down"
        assert writer.num_writes == 0 and not writer.connected


@pytest.mark.asyncio
async def test_a_cancelled_writer_always_stops():
    """Shutdown cancels the writer at any point of its loop (asyncio.wait_for lost about one cancel in seven here
    when Redis refused connections, and the scheduler's shutdown then waited forever)."""
    rng = random.Random(0)
    for attempt in range(100):
        config = RedisStateConfig(redis_url=f"redis://127.0.0.1:{closed_port()}/0", redis_flush_interval_s=0.001,
                                  redis_stats_interval_s=0.01, redis_timeout_s=0.2)
        writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, PrefixIndex)
        task = await cancelled_after(writer.run(), rng.uniform(0.0, 0.02))
        assert task.cancelled(), f"attempt {attempt}: the writer ended otherwise: {task.exception()!r}"


@pytest.mark.asyncio
async def test_a_cancelled_writer_stops_while_redis_answers_too(tmp_path):
    """With Redis up, redis-py turned about one cancel in three of a flushing writer into an error or a return, and
    the loop went on: the writer checks its task's cancel state itself."""
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    rng = random.Random(1)
    config = RedisStateConfig(redis_url=server.url, redis_flush_interval_s=0.005, redis_stats_interval_s=0.01,
                              redis_prefix_sync_interval_s=0.005)
    try:
        for _ in range(60):
            index = PrefixIndex()
            writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.1}, lambda index=index: index)
            for block_id in range(20):  # published once the writer runs
                index.insert(rng.randbytes(16), block_id)
            await cancelled_after(writer.run(), rng.uniform(0.0, 0.2))
    finally:
        server.kill()


def test_a_full_queue_drops_instead_of_blocking():
    config = RedisStateConfig(redis_url="redis://127.0.0.1:1/0", redis_queue_size=2)
    writer = RedisStateWriter(config, "unit", dict, PrefixIndex)
    for i in range(5):
        writer.request_first_token(f"r{i}", 0)
    assert writer.num_dropped == 3


@pytest.mark.asyncio
async def test_a_write_made_while_backing_off_lands_when_redis_returns(tmp_path):
    """Writes made during a backoff wait are held (the newest), not dropped: a request that finishes just after
    Redis comes back has its state written by the first attempt after the wait."""
    server = RedisServer(tmp_path / "redis.log")  # not started yet: the first attempts fail and back off
    config = RedisStateConfig(redis_url=server.url, redis_flush_interval_s=0.01, redis_stats_interval_s=60,
                              redis_timeout_s=0.2)
    writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, lambda: PrefixIndex())
    try:
        async with running(writer.run()):
            writer.request_arrived("early", 3, 0.0)
            await wait_for_async(lambda: writer._backoff.failures >= 3, what="backing off, each wait longer")
            server.start()
            writer.request_arrived("during-wait", 3, 0.0)  # made inside the current wait
            writer.request_finished("during-wait", "stop", 1, 0)
            await wait_for_async(lambda: writer.num_writes > 0, what="a write once Redis is back")
            fields = server.client().hgetall(f"{writer.prefix}request:during-wait")
            assert fields.get("status") == "finished", fields
    finally:
        server.kill()
