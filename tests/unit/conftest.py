"""Fixtures shared by unit tests of several areas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.processes import RedisServer


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A real redis-server of this test's own (raises when redis-server is missing), killed after the test."""
    server = RedisServer(tmp_path / "redis.log")
    server.start()
    yield server
    server.kill()
