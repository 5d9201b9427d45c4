"""The gateway's prefix-index reader never logs the Redis password (start-up, auth failure), and a URL Redis cannot
take stops the gateway at start with exit code 2 and a line naming the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedserve.services.gateway.routing.prefix_mirror import PrefixMirror
from tests.integration.processes import MODEL_DIR, REPO
from tests.unit.scheduler_service.test_redis_secrets import (  # noqa: F401 (fixture)
    PASSWORD,
    first_attempt,
    redis_with_password,
    wrong_then_right,
)  # noqa: F401 (fixture)


async def _read_once(url: str) -> PrefixMirror:
    mirror = PrefixMirror(url, timeout_s=1.0, stats_interval_s=0.01, retry_interval_s=0.05)
    mirror.follow(["scheduler-a"])  # with nothing to follow it reads nothing
    return await first_attempt(mirror)


@pytest.mark.asyncio
async def test_the_prefix_mirror_logs_the_redis_url_masked(redis_with_password, caplog):  # noqa: F811
    logger = "pagedserve.services.gateway.routing.prefix_mirror"
    warning, info = await wrong_then_right(_read_once, redis_with_password, caplog, logger)
    assert f"Redis at redis://:***@127.0.0.1:{redis_with_password}/0 unreadable" in warning
    assert f"reading Redis at redis://:***@127.0.0.1:{redis_with_password}/0" in info


def test_a_url_redis_cannot_take_stops_the_gateway_with_exit_2():
    argv = [sys.executable, "-m", "pagedserve.services.gateway", str(MODEL_DIR), "--redis-url",
            f"http://:{PASSWORD}@cache:6379"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    last_line = done.stderr.strip().splitlines()[-1]
    assert "--redis-url has scheme 'http'" in last_line and PASSWORD not in done.stderr
