"""The scheduler's copy in Redis: live request state, its prefix-cache index and its load, for gateways' routers.

Off the hot path: the engine loop only enqueues (put_nowait on a bounded queue) and the prefix index only journals;
a background task drains both and writes in one pipelined MULTI/EXEC per flush. When Redis is slow, down or the
queue is full, writes are dropped and counted, the outage is logged once, and serving goes on; the next flush
simply tries again, so the writer reconnects by itself when Redis returns (and then republishes the whole prefix
index, see prefix_publisher.py).

Keys (one namespace per scheduler instance, so several schedulers can share one Redis; see shared/replica_keys.py):
  pagedserve:{instance}:request:{req_id}  hash    status, times, token counts      TTL request_ttl_s
  pagedserve:{instance}:stats             hash    kv_usage, num_running, ...       TTL instance_ttl_s
  pagedserve:{instance}:prefix_blocks     set     hex keys of cached full blocks   TTL instance_ttl_s
  pagedserve:{instance}:prefix_events     stream  its changes, in order            TTL instance_ttl_s
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.prefix_publisher import PrefixPublisher
from pagedserve.shared.cancellation import raise_if_cancelled
from pagedserve.shared.redis_client import ReconnectBackoff, bounded_client
from pagedserve.shared.redis_url import check_redis_url, masked_url
from pagedserve.shared.replica_keys import (
    SNAPSHOT,
    PrefixEvent,
    key_prefix,
    prefix_blocks_key,
    prefix_events_key,
    stats_key,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisStateConfig:
    redis_url: str = ""  # e.g. redis://127.0.0.1:6379/0; empty: no Redis copy
    redis_queue_size: int = 10_000  # pending writes at most; more are dropped and counted
    redis_flush_interval_s: float = 0.05  # how long writes may wait to be batched
    redis_stats_interval_s: float = 0.25  # KV usage / queue sizes refresh
    redis_prefix_sync_interval_s: float = 0.1  # how often prefix-cache changes are published
    redis_prefix_events_max: int = 2000  # entries kept in the prefix_events stream (a slower reader resyncs)
    redis_prefix_snapshot_interval_s: float = 60.0  # the whole prefix index is republished at least this often
    redis_request_ttl_s: float = 3600.0  # request hashes expire after this
    redis_instance_ttl_s: float = 30.0  # stats and prefix index vanish this long after the instance stops
    redis_timeout_s: float = 0.5  # per flush; a slower Redis counts as down

    def __post_init__(self) -> None:
        if self.redis_url:
            try:
                check_redis_url(self.redis_url)
            except ValueError as exc:
                raise ValueError(f"--redis-url {exc}") from None


@dataclass
class _HashWrite:
    key: str
    fields: dict[str, str | int | float]
    ttl_s: float

    def apply(self, pipe) -> None:
        pipe.hset(self.key, mapping=self.fields)
        pipe.expire(self.key, int(self.ttl_s))


@dataclass
class _PrefixPublish:
    """One prefix event: the set changed and the event appended in the same transaction."""

    instance_id: str
    event: PrefixEvent
    members: list[str]  # the whole set, for a snapshot
    ttl_s: float
    max_events: int

    def apply(self, pipe) -> None:
        blocks, events = prefix_blocks_key(self.instance_id), prefix_events_key(self.instance_id)
        if self.event.op == SNAPSHOT:
            pipe.delete(blocks)
            for start in range(0, len(self.members), 10_000):
                pipe.sadd(blocks, *self.members[start:start + 10_000])
        else:
            if self.event.added:
                pipe.sadd(blocks, *self.event.added)
            if self.event.removed:
                pipe.srem(blocks, *self.event.removed)
        pipe.xadd(events, self.event.to_fields(), maxlen=self.max_events, approximate=True)
        for key in (blocks, events):
            pipe.expire(key, int(self.ttl_s))


@dataclass
class _Expire:
    keys: list[str]
    ttl_s: float

    def apply(self, pipe) -> None:
        for key in self.keys:
            pipe.expire(key, int(self.ttl_s))


_Write = _HashWrite | _PrefixPublish | _Expire


_MAX_HELD = 1000  # writes held through a backoff wait at most (one flush's worth)


class RedisStateWriter:
    def __init__(self, config: RedisStateConfig, instance_id: str, stats_source: Callable[[], dict],
                 prefix_source: Callable[[], PrefixIndex]) -> None:
        self.config = config
        self.instance_id = instance_id
        self.prefix = key_prefix(instance_id)
        self._stats_source = stats_source
        self._publisher = PrefixPublisher(prefix_source, snapshot_interval_s=config.redis_prefix_snapshot_interval_s)
        self._queue: asyncio.Queue[_HashWrite] = asyncio.Queue(config.redis_queue_size)
        self.num_writes = 0
        self.num_dropped = 0
        self.connected = False
        self._outage_logged = False
        self._backoff = ReconnectBackoff()
        self._retry_at_s = 0.0  # after a failed flush: no Redis call before this (monotonic)
        # writes made while backing off, the newest kept: they go first in the next attempt, so a write made just
        # after Redis returns is not lost to the wait (a failed attempt drops them, counted)
        self._held: deque[_Write] = deque(maxlen=_MAX_HELD)

    # --- called by the engine loop: never blocks, never raises --------------------------------------------

    def request_arrived(self, req_id: str, num_prompt_tokens: int, arrival_time_s: float) -> None:
        self._put_request(req_id, {"status": "waiting", "arrival_time_s": arrival_time_s,
                                   "num_prompt_tokens": num_prompt_tokens, "num_output_tokens": 0})

    def request_first_token(self, req_id: str, num_cached_tokens: int) -> None:
        self._put_request(req_id, {"status": "running", "first_token_time_s": time.time(),
                                   "num_cached_tokens": num_cached_tokens})

    def request_finished(self, req_id: str, finish_reason: str, num_output_tokens: int,
                         num_cached_tokens: int) -> None:
        self._put_request(req_id, {"status": "finished", "finish_reason": finish_reason,
                                   "finish_time_s": time.time(), "num_output_tokens": num_output_tokens,
                                   "num_cached_tokens": num_cached_tokens})

    def _put_request(self, req_id: str, fields: dict) -> None:
        self._put(_HashWrite(f"{self.prefix}request:{req_id}", fields, self.config.redis_request_ttl_s))

    def _put(self, write: _HashWrite) -> None:
        try:
            self._queue.put_nowait(write)
        except asyncio.QueueFull:
            self.num_dropped += 1

    # --- the background task ------------------------------------------------------------------------------

    async def run(self) -> None:
        client = bounded_client(self.config.redis_url, self.config.redis_timeout_s)
        next_stats_s = next_prefix_s = 0.0
        try:
            while True:
                writes: list[_Write] = await self._drain(self.config.redis_flush_interval_s)
                now_s = time.monotonic()
                if now_s < self._retry_at_s:  # backing off after a failure: hold the newest writes
                    self.num_dropped += max(0, len(self._held) + len(writes) - _MAX_HELD)
                    self._held.extend(writes)
                    continue
                if self._held:
                    writes = [*self._held, *writes]
                    self._held.clear()
                if now_s >= next_stats_s:
                    writes.append(self._stats_write())
                    next_stats_s = now_s + self.config.redis_stats_interval_s
                if now_s >= next_prefix_s:
                    writes.append(self._prefix_write())
                    next_prefix_s = now_s + self.config.redis_prefix_sync_interval_s
                if writes:
                    await self._flush(client, writes)
                raise_if_cancelled()  # redis-py may have turned a cancel of this task into an error or a return
        finally:
            await client.aclose()

    async def _drain(self, wait_s: float) -> list[_Write]:
        writes: list[_Write] = []
        try:
            async with asyncio.timeout(wait_s):  # unlike wait_for, never swallows a cancel of this task
                writes.append(await self._queue.get())
        except TimeoutError:
            return writes
        while not self._queue.empty() and len(writes) < 1000:
            writes.append(self._queue.get_nowait())
        return writes

    def _stats_write(self) -> _HashWrite:
        fields = {**self._stats_source(), "updated_at_s": time.time()}
        return _HashWrite(stats_key(self.instance_id), fields, self.config.redis_instance_ttl_s)

    def _prefix_write(self) -> _PrefixPublish | _Expire:
        """The index's changes since the last publish; with none, the keys' TTL is refreshed instead."""
        made = self._publisher.next_event()
        ttl_s = self.config.redis_instance_ttl_s
        if made is None:
            return _Expire([prefix_blocks_key(self.instance_id), prefix_events_key(self.instance_id)], ttl_s)
        event, members = made
        return _PrefixPublish(self.instance_id, event, members, ttl_s, self.config.redis_prefix_events_max)

    async def _flush(self, client: aioredis.Redis, writes: list[_Write]) -> None:
        try:
            async with asyncio.timeout(self.config.redis_timeout_s):
                await self._execute(client, writes)
        except (TimeoutError, RedisError, OSError) as exc:
            self.num_dropped += len(writes)
            self.connected = False
            self._publisher.lost()  # a timed-out transaction may or may not have been applied
            self._retry_at_s = time.monotonic() + self._backoff.next_delay_s()
            if not self._outage_logged:
                log.warning("Redis at %s unavailable (%s): dropping state writes until it returns",
                            masked_url(self.config.redis_url), exc)
                self._outage_logged = True
            return
        self._backoff.reset()
        self.num_writes += len(writes)
        if not self.connected:
            log.info("Redis state writes to %s (%d dropped so far)", masked_url(self.config.redis_url),
                     self.num_dropped)
        self.connected, self._outage_logged = True, False

    async def _execute(self, client: aioredis.Redis, writes: list[_Write]) -> None:
        # MULTI/EXEC: a reader never sees the prefix set changed without its event, or deleted but not refilled
        async with client.pipeline(transaction=True) as pipe:
            for write in writes:
                write.apply(pipe)
            await pipe.execute()


class NullStateWriter:
    """Stands in for RedisStateWriter when no Redis URL is configured."""

    num_writes = 0
    num_dropped = 0
    connected = False

    def request_arrived(self, req_id: str, num_prompt_tokens: int, arrival_time_s: float) -> None:
        pass

    def request_first_token(self, req_id: str, num_cached_tokens: int) -> None:
        pass

    def request_finished(self, req_id: str, finish_reason: str, num_output_tokens: int,
                         num_cached_tokens: int) -> None:
        pass
