"""Stored responses (`store: true`): each response with the conversation that led to it, for GET, DELETE and the
next turn's `previous_response_id`.

With `--redis-url` they live in Redis under `pagedserve:response:{id}` with a TTL, so any gateway serves any
stored response. Without Redis they live in this gateway's memory: an LRU bounded in bytes, with the same TTL, that
other gateways cannot see and a restart loses (said in the log at start and in /metrics).

A record is one JSON text: {"input": [items], "response": {...}}; `input` holds the whole conversation before the
response's output (earlier turns included), so a chain of turns never needs more than one read.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.shared.redis_client import bounded_client

log = logging.getLogger(__name__)
KEY_PREFIX = "pagedserve:response:"
# what a response id this gateway made can look like (resp_ + hex); any other id names no stored response, and is
# answered without Redis (a lone surrogate in a client's id would not even encode as a key)
_ID_SHAPE = re.compile(r"resp_[0-9A-Za-z]{1,64}")


@dataclass(frozen=True)
class StoredResponse:
    input: list[dict]  # the conversation's items before this response's output
    response: dict

    def conversation(self) -> list[dict]:
        """The items a next turn continues: the input, then this response's output."""
        return self.input + self.response["output"]

    def to_json(self) -> str:
        return json.dumps({"input": self.input, "response": self.response}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> StoredResponse:
        record = json.loads(text)
        return cls(record["input"], record["response"])


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse) -> None: ...
    async def get(self, response_id: str) -> StoredResponse | None: ...
    async def delete(self, response_id: str) -> bool: ...
    async def close(self) -> None: ...


class MemoryResponseStore:
    """This gateway's own store: least recently used records go first once `max_bytes` of JSON is held."""

    def __init__(self, ttl_s: float, max_bytes: int, registry: CollectorRegistry | None = None) -> None:
        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._records: OrderedDict[str, tuple[float, str]] = OrderedDict()  # id -> (expiry, JSON)
        self.num_bytes = 0
        if registry is not None:
            Gauge("pagedserve_gateway_stored_responses_in_memory_bytes", "JSON bytes of the responses this gateway "
                  "stores in its own memory (no --redis-url: other gateways cannot serve them)",
                  registry=registry).set_function(lambda: self.num_bytes)

    async def put(self, stored: StoredResponse) -> None:
        text = stored.to_json()
        if len(text) > self.max_bytes:
            log.warning("response %s (%d bytes) is larger than the whole store: not stored", stored.response["id"],
                        len(text))
            return
        self._pop(stored.response["id"])
        self._records[stored.response["id"]] = (time.monotonic() + self.ttl_s, text)
        self.num_bytes += len(text)
        while self.num_bytes > self.max_bytes:
            self._pop(next(iter(self._records)))

    async def get(self, response_id: str) -> StoredResponse | None:
        entry = self._records.get(response_id)
        if entry is None:
            return None
        if entry[0] < time.monotonic():
            self._pop(response_id)
            return None
        self._records.move_to_end(response_id)
        return StoredResponse.from_json(entry[1])

    async def delete(self, response_id: str) -> bool:
        return self._pop(response_id) is not None

    async def close(self) -> None:
        pass

    def _pop(self, response_id: str) -> tuple[float, str] | None:
        entry = self._records.pop(response_id, None)
        if entry is not None:
            self.num_bytes -= len(entry[1])
        return entry


class RedisResponseStore:
    """Records in Redis with a TTL. A failed write is logged and counted (the answer still goes out); a failed
    read is a 503."""

    def __init__(self, redis_url: str, ttl_s: float, timeout_s: float = 2.0,
                 registry: CollectorRegistry | None = None) -> None:
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._redis = bounded_client(redis_url, timeout_s)
        self.write_failures = Counter("pagedserve_gateway_response_store_write_failures", "Responses that could not "
                                      "be stored in Redis (later turns naming them get a 404)", registry=registry)

    async def put(self, stored: StoredResponse) -> None:
        try:
            await self._redis.set(KEY_PREFIX + stored.response["id"], stored.to_json(), px=self.ttl_ms)
        except RedisError as exc:
            self.write_failures.inc()
            log.warning("response %s was not stored: Redis failed (%s)", stored.response["id"], type(exc).__name__)

    async def get(self, response_id: str) -> StoredResponse | None:
        if not _ID_SHAPE.fullmatch(response_id):
            return None
        text = await self._call(self._redis.get(KEY_PREFIX + response_id))
        return None if text is None else StoredResponse.from_json(text)

    async def delete(self, response_id: str) -> bool:
        if not _ID_SHAPE.fullmatch(response_id):
            return False
        return bool(await self._call(self._redis.delete(KEY_PREFIX + response_id)))

    async def close(self) -> None:
        await self._redis.aclose()

    @staticmethod
    async def _call(command):
        try:
            return await command
        except RedisError as exc:
            raise OpenAIError(503, f"the response store (Redis) is unavailable: {type(exc).__name__}",
                              code="service_unavailable") from None


def open_store(redis_url: str, ttl_s: float, max_bytes: int, registry: CollectorRegistry | None) -> ResponseStore:
    if redis_url:
        return RedisResponseStore(redis_url, ttl_s, registry=registry)
    log.warning("no --redis-url: stored responses are kept in this gateway's memory (at most %d bytes, %g s each); "
                "other gateways cannot serve them and a restart loses them", max_bytes, ttl_s)
    return MemoryResponseStore(ttl_s, max_bytes, registry)
