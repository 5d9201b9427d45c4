"""Token buckets: the Lua script in a real Redis and the per-gateway fallback agree; a dead Redis costs a request
no more than the short deadline, and the limits degrade to per-gateway with the gauge saying so."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from pagedserve.services.gateway.tenants.keys_file import Tenant
from pagedserve.services.gateway.tenants.metrics import TenantMetrics
from pagedserve.services.gateway.tenants.rate_limit import REDIS_TIMEOUT_S, BucketState, LocalBuckets, RateLimiter
from pagedserve.services.ports import free_port


def test_local_buckets_refill_at_limit_per_minute():
    now = [0.0]
    buckets = LocalBuckets(clock=lambda: now[0])
    args = [60, 1, 1]  # limit 60, take 1, need 1
    assert [buckets.take(["k"], args)[0] for _ in range(61)] == [1.0] * 60 + [0.0]
    now[0] = 1.0  # one second refills one request
    assert buckets.take(["k"], args)[0] == 1.0 and buckets.take(["k"], args)[0] == 0.0


def test_a_refused_take_takes_nothing_from_any_bucket():
    buckets = LocalBuckets(clock=lambda: 0.0)
    buckets.take(["tok"], [100, 150, -1e18])  # tokens spent after the fact: the bucket is in debt
    assert buckets.take(["req", "tok"], [60, 1, 1, 100, 0, 1]) == [0.0, 60.0, -50.0]


def test_bucket_state_gives_openai_headers():
    state = BucketState("requests", 60, 0.5)
    assert state.remaining == 0 and state.wait_s() == pytest.approx(0.5) and state.reset_s == pytest.approx(59.5)


@pytest.mark.asyncio
async def test_redis_buckets_are_shared_between_limiters_and_degrade_when_redis_dies(redis_server):
    gauges = [TenantMetrics(CollectorRegistry()).limits_shared for _ in range(2)]
    one, two = (RateLimiter(redis_server.url, gauge) for gauge in gauges)
    tenant = Tenant("team-a", rpm=4, tpm=1000)
    try:
        decisions = [await limiter.admit(tenant) for limiter in (one, two, one, two, one)]
        assert [d.allowed for d in decisions] == [True, True, True, True, False]
        refused = decisions[-1].headers()
        assert refused["x-ratelimit-limit-requests"] == "4" and refused["x-ratelimit-remaining-requests"] == "0"
        assert int(refused["Retry-After"]) >= 1 and refused["x-ratelimit-limit-tokens"] == "1000"
        assert [g._value.get() for g in gauges] == [1, 1]

        one.spend_tokens(Tenant("team-t", tpm=100), 150)  # in the background: a debt both limiters see
        await asyncio.sleep(0.2)
        assert not (await two.admit(Tenant("team-t", tpm=100))).allowed

        redis_server.kill()
        start_s = time.monotonic()
        fallback = await one.admit(Tenant("team-b", rpm=1))
        assert time.monotonic() - start_s < 10 * REDIS_TIMEOUT_S + 0.2
        assert fallback.allowed and gauges[0]._value.get() == 0
        assert not (await one.admit(Tenant("team-b", rpm=1))).allowed  # per gateway now, still limited
    finally:
        await one.close()
        await two.close()


@pytest.mark.asyncio
async def test_an_unreachable_redis_never_holds_a_request():
    gauge = TenantMetrics(CollectorRegistry()).limits_shared
    limiter = RateLimiter(f"redis://127.0.0.1:{free_port()}/0", gauge)
    try:
        start_s = time.monotonic()
        results = [await limiter.admit(Tenant("t", rpm=100)) for _ in range(20)]
        assert time.monotonic() - start_s < 1.0  # one failed try, then per-gateway buckets for RETRY_REDIS_S
        assert all(r.allowed for r in results) and gauge._value.get() == 0
    finally:
        await limiter.close()


@pytest.mark.asyncio
async def test_a_tenant_without_limits_never_calls_redis():
    limiter = RateLimiter(f"redis://127.0.0.1:{free_port()}/0")
    decision = await limiter.admit(Tenant("free"))
    assert decision.allowed and decision.headers() == {}
    await limiter.close()
