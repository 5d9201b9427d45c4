"""The gateway's in-memory copy of each replica's prefix-cache index and load, followed from Redis.

Per instance it reads the prefix_blocks set once (with the last prefix_events entry, in one MULTI/EXEC, so the
set and the entry's seq agree), then applies the stream's deltas as they come (XREAD, blocking briefly); a
snapshot entry or a gap in seq reads the set again. Loads (the stats hash) are read every `stats_interval_s`.
Routing reads only this memory: no Redis call on a request's path. While Redis cannot be read, `connected` is
False and every view is dropped (its keys may be stale), so the router falls back; on return all are reread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pagedserve.shared.cancellation import raise_if_cancelled
from pagedserve.shared.redis_client import ReconnectBackoff, bounded_client
from pagedserve.shared.redis_url import masked_url
from pagedserve.shared.replica_keys import DELTA, PrefixEvent, prefix_blocks_key, prefix_events_key, stats_key

log = logging.getLogger(__name__)
_BLOCK_MS = 100  # how long one XREAD waits for new entries


@dataclass(frozen=True)
class ReplicaLoad:
    num_running: int
    num_waiting: int
    kv_usage: float
    updated_at_s: float  # the scheduler's wall clock at publication

    @classmethod
    def from_hash(cls, fields: dict) -> ReplicaLoad | None:
        try:
            return cls(int(float(fields["num_running"])), int(float(fields["num_waiting"])),
                       float(fields.get("kv_usage", 0.0)), float(fields.get("updated_at_s", 0.0)))
        except (KeyError, ValueError):
            return None


@dataclass
class InstanceView:
    keys: set[bytes] = field(default_factory=set)  # the instance's cached block keys
    seq: int = 0  # of the last event applied (0: none yet)
    last_id: str = "0-0"  # stream position read up to
    load: ReplicaLoad | None = None
    synced: bool = False  # keys were read from Redis at least once since (re)connecting


class PrefixMirror:
    def __init__(self, redis_url: str, timeout_s: float = 1.0, stats_interval_s: float = 0.25,
                 retry_interval_s: float = 0.1, retry_max_s: float = 2.0) -> None:
        self.redis_url = redis_url
        self.timeout_s = timeout_s
        self.stats_interval_s = stats_interval_s
        self.backoff = ReconnectBackoff(retry_interval_s, retry_max_s)  # between failed rounds, jittered
        self.views: dict[str, InstanceView] = {}  # instance id -> its view
        self.connected = False  # the last Redis read succeeded
        self._next_stats_s = 0.0
        self._outage_logged = False

    def follow(self, instance_ids: list[str]) -> None:
        """Follow these instances (the live replicas); others are forgotten."""
        for instance_id in instance_ids:
            self.views.setdefault(instance_id, InstanceView())
        for instance_id in [i for i in self.views if i not in instance_ids]:
            del self.views[instance_id]

    def view(self, instance_id: str) -> InstanceView | None:
        """The instance's view when it is current (Redis readable and the set read), else None."""
        view = self.views.get(instance_id)
        return view if self.connected and view is not None and view.synced else None

    async def run(self) -> None:
        client = bounded_client(self.redis_url, self.timeout_s + _BLOCK_MS / 1000, connect_timeout_s=self.timeout_s)
        try:
            while True:
                try:
                    await self.poll(client)
                except (RedisError, OSError, TimeoutError) as exc:
                    raise_if_cancelled()
                    self._lost(exc)
                    await asyncio.sleep(self.backoff.next_delay_s())
                    continue
                raise_if_cancelled()
                self.backoff.reset()
                if not self.connected:
                    log.info("prefix index: reading Redis at %s", masked_url(self.redis_url))
                self.connected, self._outage_logged = True, False
        finally:
            await client.aclose()

    async def poll(self, client: aioredis.Redis) -> None:
        """One round: sync new views, apply new stream entries, refresh loads when due."""
        for instance_id, view in list(self.views.items()):
            if not view.synced:
                await self._sync(client, instance_id, view)
        if not self.views:
            await asyncio.sleep(_BLOCK_MS / 1000)
        else:
            streams = {prefix_events_key(i): v.last_id for i, v in self.views.items()}
            async with asyncio.timeout(self.timeout_s + _BLOCK_MS / 1000):
                replies = await client.xread(streams, count=1000, block=_BLOCK_MS)
            for stream, entries in replies or []:
                await self._apply(client, _instance_of(stream), entries)
        if time.monotonic() >= self._next_stats_s:
            await self._read_loads(client)
            self._next_stats_s = time.monotonic() + self.stats_interval_s

    async def _sync(self, client: aioredis.Redis, instance_id: str, view: InstanceView) -> None:
        async with asyncio.timeout(self.timeout_s):
            async with client.pipeline(transaction=True) as pipe:
                pipe.smembers(prefix_blocks_key(instance_id))
                pipe.xrevrange(prefix_events_key(instance_id), count=1)
                members, last = await pipe.execute()
        view.keys = {bytes.fromhex(_text(m)) for m in members}
        view.seq, view.last_id = (PrefixEvent.from_fields(last[0][1]).seq, _text(last[0][0])) if last else (0, "0-0")
        view.synced = True

    async def _apply(self, client: aioredis.Redis, instance_id: str, entries: list) -> None:
        view = self.views.get(instance_id)
        if view is None:
            return
        for entry_id, fields in entries:
            event = PrefixEvent.from_fields(fields)
            if event.op != DELTA or event.seq != view.seq + 1:  # a snapshot, or entries we did not see
                await self._sync(client, instance_id, view)
                return
            view.keys.update(bytes.fromhex(k) for k in event.added)
            view.keys.difference_update(bytes.fromhex(k) for k in event.removed)
            view.seq, view.last_id = event.seq, _text(entry_id)

    async def _read_loads(self, client: aioredis.Redis) -> None:
        instance_ids = list(self.views)
        async with asyncio.timeout(self.timeout_s):
            async with client.pipeline(transaction=False) as pipe:
                for instance_id in instance_ids:
                    pipe.hgetall(stats_key(instance_id))
                replies = await pipe.execute()
        for instance_id, fields in zip(instance_ids, replies, strict=True):
            if instance_id in self.views:
                self.views[instance_id].load = ReplicaLoad.from_hash({_text(k): _text(v) for k, v in fields.items()})

    def _lost(self, exc: BaseException) -> None:
        if not self._outage_logged:
            log.warning("prefix index: Redis at %s unreadable (%s): routing without it until it returns",
                        masked_url(self.redis_url), exc)
            self._outage_logged = True
        self.connected = False
        for view in self.views.values():
            view.synced, view.keys, view.load = False, set(), None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _instance_of(stream: str | bytes) -> str:
    """pagedserve:{instance}:prefix_events -> instance (instance ids may hold ':')."""
    return _text(stream).removeprefix("pagedserve:").removesuffix(":prefix_events")
