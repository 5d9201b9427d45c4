"""A Redis client that a broken or hostile server cannot make expensive: bounded replies, timeouts, backoff.

Contract:
- Replies are bounded (RedisLimits): an array header longer than `max_array_len`, a bulk string longer than
  `max_bulk_bytes`, or a reply holding more than `max_reply_elements` elements in all (nested ones counted) fails
  at that header with InvalidResponse (a RedisError), before any of it is read; redis-py then drops the connection.
  A server answering `*2147483647` and streaming integers therefore costs one line's parse, not a core.
- Every socket read and connect times out after `timeout_s`; the client never retries inside a call (a caller's
  await is never stretched by hidden retries).
- Between failed rounds the caller waits ReconnectBackoff.next_delay_s(): exponential, capped, with equal jitter
  (redis-py's EqualJitterBackoff: between half and all of the step), reset by the first success. Callers are
  background tasks: nothing on a request's path or the engine step awaits Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis.asyncio as aioredis
from redis._parsers import _AsyncRESP2Parser
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.exceptions import InvalidResponse, ResponseError
from redis.typing import EncodableT


@dataclass(frozen=True)
class RedisLimits:
    """What one reply may hold. The defaults fit a prefix index of a million cached blocks read by SMEMBERS."""

    max_array_len: int = 1 << 21  # elements of one array
    max_reply_elements: int = 1 << 22  # elements of one reply, nested ones included
    max_bulk_bytes: int = 64 << 20  # bytes of one bulk string (a prefix event of 200k keys is ~7 MB)


class BoundedRESP2Parser(_AsyncRESP2Parser):
    """redis-py's pure-Python RESP2 parser with every length header checked against `limits` before it is used."""

    limits = RedisLimits()

    def __init__(self, socket_read_size: int) -> None:
        super().__init__(socket_read_size)
        self._num_elements = 0

    async def read_response(self, disable_decoding: bool = False
                            ) -> EncodableT | ResponseError | None | list[EncodableT]:
        """One whole reply, its element count from 0."""
        self._num_elements = 0
        reply: EncodableT | ResponseError | None | list[EncodableT] = await super().read_response(disable_decoding)
        return reply

    async def _readline(self) -> bytes:
        line = await super()._readline()  # one element's header: every element of a reply passes here
        self._num_elements += 1
        if self._num_elements > self.limits.max_reply_elements:
            raise InvalidResponse(f"Redis reply exceeds {self.limits.max_reply_elements} elements")
        kind = line[:1]
        if kind in (b"*", b"$") and line[1:2] != b"-":
            length = _header_length(line)
            limit = self.limits.max_array_len if kind == b"*" else self.limits.max_bulk_bytes
            if length > limit:
                raise InvalidResponse(f"Redis reply header {line[:24]!r} exceeds the limit {limit}")
        return line


def _header_length(line: bytes) -> int:
    try:
        return int(line[1:])
    except ValueError:
        raise InvalidResponse(f"Redis reply header {line[:24]!r} is not a length") from None


def bounded_parser(limits: RedisLimits) -> type[BoundedRESP2Parser]:
    """The parser class with these limits (redis-py builds parsers from a class, per connection)."""
    if limits == BoundedRESP2Parser.limits:
        return BoundedRESP2Parser
    return type("BoundedRESP2Parser", (BoundedRESP2Parser,), {"limits": limits})


def bounded_client(url: str, timeout_s: float, connect_timeout_s: float | None = None,
                   limits: RedisLimits = RedisLimits()) -> aioredis.Redis:
    """A client for `url` (RESP2) whose replies are bounded by `limits` and whose reads time out after timeout_s."""
    return aioredis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s or timeout_s,
        retry=Retry(NoBackoff(), 0), parser_class=bounded_parser(limits), protocol=2)


@dataclass
class ReconnectBackoff:
    """How long to wait after the n-th failure in a row: d/2 + uniform(0, d/2) with d = min(cap_s, base_s * 2**n)."""

    base_s: float = 0.1
    cap_s: float = 2.0
    failures: int = 0

    def next_delay_s(self) -> float:
        self.failures += 1
        return EqualJitterBackoff(cap=self.cap_s, base=self.base_s).compute(self.failures)

    def reset(self) -> None:
        self.failures = 0
