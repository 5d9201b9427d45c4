"""The HTTP edge: uvicorn's httptools protocol with the bounds a proxy would put in front of it.

- A request head (request line + header fields) over `max_header_bytes`, or with more than `max_headers` fields,
  gets 431 and the connection is closed: at most one socket read past the limit is ever held.
- A head not complete `header_timeout_s` after the connection opened (or after the next request's first byte),
  and a body not complete `body_timeout_s` after its head, get 408 and the connection is closed: a slowloris or
  slow-body socket frees its connection and its admission slot (the app sees a disconnect).
- One client address holds at most `max_connections_per_client` connections; beyond, a new one gets 429 and is
  closed before its request is read.
Idle keep-alive time and the total number of connections are uvicorn's own options (`uvicorn_options`).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass
class EdgeLimits:
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections_per_client: int = 256
    per_client: Counter[str] = field(default_factory=Counter)  # client address -> connections open


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request that is being refused."""


def raw_error(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response (OpenAI-shaped JSON) that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class EdgeProtocol(HttpToolsProtocol):
    limits: EdgeLimits = EdgeLimits()  # set per server by `edge_protocol`

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._host: str | None = None  # set once counted in limits.per_client
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True
        self._head_bytes = 0  # bytes received since the head began (a socket-read granularity bound)
        self._field_bytes = 0  # the parsed head's exact size so far
        self._num_headers = 0
        self._refusal: bytes | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        host = self.client[0] if self.client else ""
        if self.limits.per_client[host] >= self.limits.max_connections_per_client:
            self._close_with(raw_error(429, f"too many connections from this client (limit "
                                            f"{self.limits.max_connections_per_client})", "rate_limit_exceeded"))
            return
        self._host = host
        self.limits.per_client[host] += 1
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._host is not None:
            self.limits.per_client[self._host] -= 1
            if self.limits.per_client[self._host] <= 0:
                del self.limits.per_client[self._host]
            self._host = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            if self._refusal is None:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
        if self._refusal is None and self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_head()
        if self._refusal is not None and not self.transport.is_closing():
            self._close_with(self._refusal)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._field_bytes, self._num_headers = True, 0, 0
        if self._timer is None:
            self._arm(self.limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._field_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._field_bytes += len(name) + len(value) + 4
        self._num_headers += 1
        if self._num_headers > self.limits.max_headers or self._field_bytes > self.limits.max_header_bytes:
            self._refuse_head()
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._disarm()
        super().on_headers_complete()
        self._arm(self.limits.body_timeout_s)  # disarmed when the message is complete (at once without a body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _refuse_head(self) -> None:
        self._refusal = raw_error(431, f"the request head is larger than this server's limit of "
                                       f"{self.limits.max_header_bytes} bytes or {self.limits.max_headers} "
                                       "header fields", "request_header_fields_too_large")

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not self._in_head:
            if cycle.response_started:  # answered before its body came (a refusal, say): only closing ends it
                self.transport.close()
                return
            cycle.disconnected = True  # the app reading the body sees a disconnect and ends
            cycle.message_event.set()
        what = "head" if self._in_head else "body"
        self._close_with(raw_error(408, f"the request {what} did not arrive in time", "request_timeout"))

    def _close_with(self, response: bytes) -> None:
        self._disarm()
        self.transport.write(response)
        self.transport.close()


def edge_protocol(limits: EdgeLimits) -> type[EdgeProtocol]:
    """The protocol class for uvicorn.Config(http=...), bound to these limits."""
    return type("BoundEdgeProtocol", (EdgeProtocol,), {"limits": limits})
