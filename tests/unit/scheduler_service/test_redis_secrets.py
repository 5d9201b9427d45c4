"""The Redis password never reaches the logs (start-up, auth failure, recovery), and a URL Redis cannot take stops
the scheduler at start with exit code 2 and a line naming the flag."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from services.ports import free_port
from services.scheduler.prefix_cache import PrefixIndex
from services.scheduler.redis_state import RedisStateConfig, RedisStateWriter
from tests.integration.processes import REPO, wait_for
from tests.support.tasks import run_until

PASSWORD = "hunter2-redis-secret"


@pytest.fixture
def redis_with_password(tmp_path):
    """A redis-server that requires PASSWORD (a real one: auth failures come from the server)."""
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--requirepass", PASSWORD],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import redis

        def answers() -> bool:
            try:
                return redis.Redis(port=port, password=PASSWORD, socket_timeout=1).ping()
            except redis.RedisError:
                return False

        wait_for(answers, 10, what="redis-server answering")
        yield port
    finally:
        process.kill()
        process.wait()


async def _flush_once(url: str) -> RedisStateWriter:
    config = RedisStateConfig(redis_url=url, redis_flush_interval_s=0.01, redis_stats_interval_s=0.01,
                              redis_timeout_s=1.0)
    writer = RedisStateWriter(config, "unit", lambda: {"kv_usage": 0.0}, PrefixIndex)
    await run_until(writer.run(), lambda: writer.connected or writer._outage_logged, what="a flush or an outage")
    return writer


@pytest.mark.asyncio
async def test_auth_failure_and_recovery_logs_mask_the_password(redis_with_password, caplog):
    caplog.set_level(logging.INFO, logger="services.scheduler.redis_state")
    wrong = await _flush_once(f"redis://:wrong-{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    right = await _flush_once(f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    assert not wrong.connected and right.connected
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    info = next(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert f"redis://:***@127.0.0.1:{redis_with_password}/0 unavailable" in warning
    assert f"writes to redis://:***@127.0.0.1:{redis_with_password}/0" in info
    assert PASSWORD not in caplog.text


@pytest.mark.parametrize("argv", [
    [sys.executable, "-m", "services.scheduler", "--redis-url", f"http://:{PASSWORD}@cache:6379"],
    [sys.executable, "-m", "services.cli", "serve", "models/SmolLM2-135M-Instruct",
     "--redis-url", f"cache:6379/0?password={PASSWORD}"],
])
def test_a_url_redis_cannot_take_stops_the_start_with_exit_2(argv):
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert "--redis-url has scheme" in last_line and "expected one of redis://, rediss://, unix://" in last_line
    assert PASSWORD not in done.stderr + done.stdout
