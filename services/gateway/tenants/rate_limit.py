"""Per-tenant rate limits as token buckets: requests per minute and tokens (prompt + generated) per minute.

A bucket holds up to `limit` and refills at limit / 60 per second. A request takes one from its requests bucket
and needs at least one token left in its tokens bucket; its tokens are taken when it ends (the bucket may go
below zero: the next requests wait until it refilled). With a Redis URL the buckets live in Redis (one Lua script
per check: atomic across gateways, on Redis's clock), so every gateway enforces the same budget. Redis calls have
a short deadline; after a failure Redis is left alone for RETRY_REDIS_S and each gateway enforces the limits on
its own (`pagedserve_gateway_rate_limits_shared` is 0 then): a slow or dead Redis never holds a request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.services.gateway.tenants.keys_file import Tenant
from pagedserve.shared.redis_url import masked_url

log = logging.getLogger(__name__)

WINDOW_S = 60.0
REDIS_TIMEOUT_S = 0.05  # a rate check waits on Redis this long at most
RETRY_REDIS_S = 2.0  # after a failed Redis call, limits are per-gateway this long before Redis is tried again
_NO_NEED = -1e18  # taking tokens after the fact never fails

# KEYS: one bucket each; ARGV: per bucket (limit, cost, need). All are taken only if every one has `need`.
_TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = 60
local levels, ok = {}, 1
for i, key in ipairs(KEYS) do
  local limit, need = tonumber(ARGV[3 * i - 2]), tonumber(ARGV[3 * i])
  local b = redis.call('HMGET', key, 'level', 'ts')
  local level = tonumber(b[1]) or limit
  local ts = tonumber(b[2]) or now
  level = math.min(limit, level + math.max(0, now - ts) * limit / window)
  if level < need then ok = 0 end
  levels[i] = level
end
local out = {ok}
for i, key in ipairs(KEYS) do
  local level = levels[i]
  if ok == 1 then level = level - tonumber(ARGV[3 * i - 1]) end
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  redis.call('PEXPIRE', key, window * 2000)
  out[i + 1] = tostring(level)
end
return out
"""


@dataclass(frozen=True)
class BucketState:
    kind: str  # "requests" or "tokens": the suffix of OpenAI's x-ratelimit-* headers
    limit: int
    level: float  # what is left (tokens may be negative)

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.level))

    @property
    def reset_s(self) -> float:
        """Until the bucket is full again."""
        return max(0.0, (self.limit - self.level) * WINDOW_S / self.limit)

    def wait_s(self, need: float = 1.0) -> float:
        """Until the bucket holds `need`."""
        return max(0.0, (need - self.level) * WINDOW_S / self.limit)


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    buckets: tuple[BucketState, ...]  # one per limit the tenant has

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(max((b.wait_s() for b in self.buckets), default=1.0)))

    def headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers (and Retry-After when refused)."""
        headers = {}
        for bucket in self.buckets:
            headers[f"x-ratelimit-limit-{bucket.kind}"] = str(bucket.limit)
            headers[f"x-ratelimit-remaining-{bucket.kind}"] = str(bucket.remaining)
            headers[f"x-ratelimit-reset-{bucket.kind}"] = f"{bucket.reset_s:.3f}s"
        if not self.allowed:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers


class LocalBuckets:
    """The same buckets in this process's memory: the fallback while Redis cannot be reached."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (level, at)

    def take(self, keys: list[str], args: list[float]) -> list[float]:
        now = self._clock()
        levels = []
        for i, key in enumerate(keys):
            limit = args[3 * i]
            level, at = self._buckets.get(key, (limit, now))
            levels.append(min(limit, level + max(0.0, now - at) * limit / WINDOW_S))
        ok = all(level >= args[3 * i + 2] for i, level in enumerate(levels))
        for i, key in enumerate(keys):
            levels[i] -= args[3 * i + 1] if ok else 0
            self._buckets[key] = (levels[i], now)
        return [float(ok), *levels]


class RateLimiter:
    def __init__(self, redis_url: str = "", shared_gauge=None) -> None:
        self.local = LocalBuckets()
        self.shared_gauge = shared_gauge  # a prometheus Gauge: 1 while limits are shared through Redis
        self._redis = (aioredis.Redis.from_url(redis_url, socket_timeout=REDIS_TIMEOUT_S,
                                               socket_connect_timeout=REDIS_TIMEOUT_S, retry_on_timeout=False)
                       if redis_url else None)
        self._script = self._redis.register_script(_TAKE_LUA) if self._redis is not None else None
        self._redis_url = redis_url
        self._skip_redis_until_s = 0.0
        self._background: set[asyncio.Task] = set()
        self._set_shared(self._redis is not None)

    async def admit(self, tenant: Tenant) -> RateDecision:
        """Take one request (and check a token is left) from the tenant's buckets; allowed=False: refuse it."""
        specs = [(kind, limit, cost, need) for kind, limit, cost, need in
                 (("requests", tenant.rpm, 1, 1), ("tokens", tenant.tpm, 0, 1)) if limit]
        if not specs:
            return RateDecision(True, ())
        levels = await self._take(tenant.name, specs)
        buckets = tuple(BucketState(kind, limit, level) for (kind, limit, _, _), level in zip(specs, levels[1:],
                                                                                               strict=True))
        return RateDecision(bool(levels[0]), buckets)

    def spend_tokens(self, tenant: Tenant, num_tokens: int) -> None:
        """Take a finished request's tokens from the tenant's bucket, in the background."""
        if not tenant.tpm or num_tokens <= 0:
            return
        task = asyncio.create_task(self._take(tenant.name, [("tokens", tenant.tpm, num_tokens, _NO_NEED)]))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _take(self, tenant_name: str, specs: list[tuple[str, int, int, float]]) -> list[float]:
        keys = [f"pagedserve:ratelimit:{tenant_name}:{kind}" for kind, *_ in specs]
        args = [value for _, limit, cost, need in specs for value in (limit, cost, need)]
        if self._script is not None and time.monotonic() >= self._skip_redis_until_s:
            try:
                reply = await asyncio.wait_for(self._script(keys=keys, args=args), REDIS_TIMEOUT_S * 2)
                self._set_shared(True)
                return [float(value) for value in reply]
            except (RedisError, OSError, TimeoutError) as exc:
                self._skip_redis_until_s = time.monotonic() + RETRY_REDIS_S
                if self._set_shared(False):
                    log.warning("rate limits: Redis at %s unreachable (%s): limits are per gateway until it "
                                "returns", masked_url(self._redis_url), type(exc).__name__)
        return self.local.take(keys, args)

    def _set_shared(self, shared: bool) -> bool:
        """Record whether limits are shared now; True when that changed."""
        changed = getattr(self, "_shared", None) != shared
        self._shared = shared
        if self.shared_gauge is not None:
            self.shared_gauge.set(int(shared))
        if changed and shared and self._redis is not None:
            log.info("rate limits: shared through Redis at %s", masked_url(self._redis_url))
        return changed

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self._redis is not None:
            await self._redis.aclose()
