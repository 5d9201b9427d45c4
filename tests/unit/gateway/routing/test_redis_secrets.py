"""The gateway's prefix-index reader never logs the Redis password (start-up, auth failure), and a URL Redis cannot
take stops the gateway at start with exit code 2 and a line naming the flag."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from services.gateway.routing.prefix_mirror import PrefixMirror
from tests.integration.processes import MODEL_DIR, REPO
from tests.support.tasks import run_until
from tests.unit.scheduler_service.test_redis_secrets import PASSWORD, redis_with_password  # noqa: F401 (fixture)


async def _read_once(url: str) -> PrefixMirror:
    mirror = PrefixMirror(url, timeout_s=1.0, stats_interval_s=0.01, retry_interval_s=0.05)
    mirror.follow(["scheduler-a"])  # with nothing to follow it reads nothing
    await run_until(mirror.run(), lambda: mirror.connected or mirror._outage_logged, what="a read or an outage")
    return mirror


@pytest.mark.asyncio
async def test_the_prefix_mirror_logs_the_redis_url_masked(redis_with_password, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="services.gateway.routing.prefix_mirror")
    wrong = await _read_once(f"redis://:wrong-{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    right = await _read_once(f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password}/0")
    assert not wrong.connected and right.connected
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    info = next(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert f"Redis at redis://:***@127.0.0.1:{redis_with_password}/0 unreadable" in warning
    assert f"reading Redis at redis://:***@127.0.0.1:{redis_with_password}/0" in info
    assert PASSWORD not in caplog.text


def test_a_url_redis_cannot_take_stops_the_gateway_with_exit_2():
    argv = [sys.executable, "-m", "services.gateway", str(MODEL_DIR), "--redis-url", f"http://:{PASSWORD}@cache:6379"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert "--redis-url has scheme 'http'" in last_line and PASSWORD not in done.stderr
