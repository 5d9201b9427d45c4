"""Redis URLs: only schemes Redis clients take, and passwords never shown."""

from __future__ import annotations

import pytest

from pagedserve.shared.redis_url import check_redis_url, masked_url


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
    ("redis://app:hunter2@cache/0", "redis://app:***@cache/0"),
    ("rediss://app:hun%40ter2@cache:6380/1?password=hunter2&socket_timeout=1",
     "rediss://app:***@cache:6380/1?password=***&socket_timeout=1"),
    ("unix:///run/redis.sock?password=hunter2&db=2", "unix:///run/redis.sock?password=***&db=2"),
    ("redis://hunter2@cache", "redis://***@cache"),
    ("redis://cache:6379/0", "redis://cache:6379/0"),
])
def test_masked_urls_hide_the_password_and_keep_the_rest(url, shown):
    assert masked_url(url) == shown
    assert "hunter2" not in masked_url(url) and "hun%40ter2" not in masked_url(url)


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://u:p@h:6380", "unix:///tmp/redis.sock"])
def test_redis_schemes_are_taken(url):
    assert check_redis_url(url) == url


@pytest.mark.parametrize(("url", "reason"), [
    ("http://:hunter2@cache:6379", "has scheme 'http'"),
    ("cache:6379", "has scheme 'cache'"),
    ("127.0.0.1:6379", "has no scheme"),
    ("redis://", "names no host"),
])
def test_other_urls_are_refused_without_showing_them(url, reason):
    with pytest.raises(ValueError) as refused:
        check_redis_url(url)
    assert reason in str(refused.value) and "hunter2" not in str(refused.value)
