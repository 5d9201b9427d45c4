"""The scheduler's HTTP endpoint for Prometheus: GET /metrics on its own port, served on the scheduler's loop."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text exposition format


async def start_metrics_server(host: str, port: int, render: Callable[[], bytes]) -> web.AppRunner:
    """Serve `render()` at /metrics until the returned runner is cleaned up; raises OSError if the port is taken."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner
