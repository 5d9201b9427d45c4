"""A hostile or mute Redis costs the bounded client one header's parse or one timeout, and its callers back off:
no core spent parsing an endless reply, no reconnect storm."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import InvalidResponse, RedisError

from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from pagedserve.shared.redis_client import ReconnectBackoff, RedisLimits, bounded_client
from tests.faults.hostile_redis import HostileRedis


@pytest.fixture
def flood():
    server = HostileRedis("flood").start()
    yield server
    server.stop()


@pytest.fixture
def silent():
    server = HostileRedis("silent").start()
    yield server
    server.stop()


async def _fixed_reply_server(reply: bytes) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            writer.write(reply)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"


@pytest.mark.asyncio
async def test_an_endless_array_fails_at_its_header(flood):
    client = bounded_client(flood.url, timeout_s=2.0)
    start_s, cpu_s = time.monotonic(), time.process_time()
    with pytest.raises(InvalidResponse, match="exceeds the limit"):
        await client.ping()
    assert time.monotonic() - start_s < 0.5 and time.process_time() - cpu_s < 0.2
    await client.aclose()


@pytest.mark.asyncio
async def test_the_unbounded_client_parses_the_flood_until_its_timeout(flood):
    """The fake is hostile for redis-py's own defaults: it reads integers until the read deadline."""
    client = aioredis.Redis.from_url(flood.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    start_s = time.monotonic()
    with pytest.raises((RedisError, TimeoutError)):
        async with asyncio.timeout(0.5):
            await client.ping()
    assert time.monotonic() - start_s >= 0.45 and flood.num_bytes_sent > 1 << 20
    await client.aclose()


@pytest.mark.asyncio
async def test_a_mute_server_times_out(silent):
    client = bounded_client(silent.url, timeout_s=0.3)
    start_s = time.monotonic()
    with pytest.raises((RedisError, TimeoutError)):
        await client.ping()
    assert 0.25 < time.monotonic() - start_s < 1.5
    await client.aclose()


@pytest.mark.asyncio
async def test_replies_within_the_limits_pass_and_larger_ones_fail():
    server, url = await _fixed_reply_server(b"*3\r\n:1\r\n$2\r\nab\r\n*1\r\n:2\r\n")
    try:
        roomy = bounded_client(url, 1.0, limits=RedisLimits(max_array_len=3, max_reply_elements=5, max_bulk_bytes=2))
        assert await roomy.execute_command("LRANGE") == [1, b"ab", [2]]
        for limits, what in ((RedisLimits(max_array_len=2), "exceeds the limit 2"),
                             (RedisLimits(max_bulk_bytes=1), "exceeds the limit 1"),
                             (RedisLimits(max_reply_elements=4), "exceeds 4 elements")):
            tight = bounded_client(url, 1.0, limits=limits)
            with pytest.raises(InvalidResponse, match=what):
                await tight.execute_command("LRANGE")
            await tight.aclose()
        await roomy.aclose()
    finally:
        server.close()


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets():
    backoff = ReconnectBackoff(base_s=0.1, cap_s=2.0)
    delays = [backoff.next_delay_s() for _ in range(40)]
    assert all(0.0 <= d <= 2.0 for d in delays) and len(set(delays)) > 30  # jittered
    assert 0.1 <= delays[0] <= 0.2 and 0.2 <= delays[1] <= 0.4 and all(d >= 1.0 for d in delays[5:])  # grows
    backoff.reset()
    assert backoff.next_delay_s() <= 0.2


async def _run_for(coroutine, seconds: float) -> float:
    """Runs the task for `seconds`; the CPU seconds this process spent meanwhile."""
    cpu_s = time.process_time()
    task = asyncio.create_task(coroutine)
    await asyncio.sleep(seconds)
    assert not task.done(), task.exception()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return time.process_time() - cpu_s


@pytest.mark.asyncio
async def test_the_state_writer_backs_off_from_a_hostile_redis(flood):
    config = RedisStateConfig(redis_url=flood.url, redis_flush_interval_s=0.01, redis_stats_interval_s=0.01)
    writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, PrefixIndex)
    cpu_s = await _run_for(writer.run(), 4.0)
    # without backoff: a connection per flush (every 0.01 s here), each parsing until the 0.5 s timeout
    assert 1 <= flood.num_connections <= 12, flood.num_connections
    assert cpu_s < 0.6, f"{cpu_s:.2f} CPU s in 4 s"
    assert not writer.connected and writer.num_writes == 0 and writer.num_dropped > 0


@pytest.mark.asyncio
async def test_the_prefix_mirror_backs_off_from_a_hostile_redis(flood):
    mirror = PrefixMirror(flood.url, timeout_s=0.5, retry_interval_s=0.05)
    mirror.follow(["scheduler-a"])
    cpu_s = await _run_for(mirror.run(), 4.0)
    assert 1 <= flood.num_connections <= 14, flood.num_connections
    assert cpu_s < 0.6, f"{cpu_s:.2f} CPU s in 4 s"
    assert not mirror.connected and mirror.view("scheduler-a") is None
