"""A local stand-in for the Kubernetes API server's pod PATCH: records every request whole and answers with the
statuses it is given (then 200), over plain HTTP or TLS."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeKubeAPI:
    statuses: list[int] = field(default_factory=list)  # answers to the first requests, in order; then 200
    requests: list[Recorded] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None
    port: int = 0

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(Recorded(request.method, request.path, dict(request.headers), await request.read()))
        self.arrived.set()
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"kind": "Pod" if status == 200 else "Status"}, status=status)
