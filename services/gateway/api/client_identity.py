"""Who is asking, for per-client limits (grammar compiles): the caller's address until requests carry a tenant."""

from __future__ import annotations

from starlette.requests import Request


def client_key(request: Request) -> str:
    return request.client.host if request.client is not None else ""
