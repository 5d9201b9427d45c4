"""The Redis password never reaches the logs (start-up, auth failure, recovery), and a URL Redis cannot take stops
the scheduler at start with exit code 2 and a line naming the flag."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from tests.integration.processes import REPO, RedisServer
from tests.support.tasks import run_until

PASSWORD = "hunter2-redis-secret"


@pytest.fixture
def redis_with_password(tmp_path):
    """A redis-server that requires PASSWORD (a real one: auth failures come from the server)."""
    server = RedisServer(tmp_path / "redis.log", password=PASSWORD)
    server.start()
    try:
        yield server.port
    finally:
        server.kill()


async def first_attempt(client):
    """Run a Redis client's loop until it connected or logged an outage; the client."""
    await run_until(client.run(), lambda: client.connected or client._outage_logged, what="a connection or an outage")
    return client


async def wrong_then_right(attempt, port: int, caplog, logger: str) -> tuple[str, str]:
    """`attempt` with a wrong password, then the right one: the first logged warning and info line. Neither
    attempt may log the password."""
    caplog.set_level(logging.INFO, logger=logger)
    wrong = await attempt(f"redis://:wrong-{PASSWORD}@127.0.0.1:{port}/0")
    right = await attempt(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    assert not wrong.connected and right.connected
    assert PASSWORD not in caplog.text
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    return warning, next(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


async def _flush_once(url: str) -> RedisStateWriter:
    config = RedisStateConfig(redis_url=url, redis_flush_interval_s=0.01, redis_stats_interval_s=0.01,
                              redis_timeout_s=1.0)
    return await first_attempt(RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, PrefixIndex))


@pytest.mark.asyncio
async def test_auth_failure_and_recovery_logs_mask_the_password(redis_with_password, caplog):
    warning, info = await wrong_then_right(_flush_once, redis_with_password, caplog,
                                           "pagedserve.services.scheduler.redis_state")
    assert f"redis://:***@127.0.0.1:{redis_with_password}/0 unavailable" in warning
    assert f"writes to redis://:***@127.0.0.1:{redis_with_password}/0" in info


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "pagedserve.services.scheduler", "--redis-url", f"http://:{PASSWORD}@cache:6379"],
    [sys.executable, "-m", "pagedserve.services.cli", "serve", "models/SmolLM2-135M-Instruct",
     "--redis-url", f"cache:6379/0?password={PASSWORD}"],
])
def test_a_url_redis_cannot_take_stops_the_start_with_exit_2(argv):
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert "--redis-url has scheme" in last_line and "expected one of redis://, rediss://, unix://" in last_line
    assert PASSWORD not in done.stderr + done.stdout
