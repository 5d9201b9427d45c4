"""A limit on request bodies, enforced while they arrive: never more than the limit is held in memory."""

from __future__ import annotations

from pagedserve.services.gateway.http.errors import RequestTooLarge, error_response


class BodyLimit:
    """413 (OpenAI-shaped) for a body over `max_bytes`: at once when Content-Length declares it, before a byte of it
    is read; for a chunked body as soon as the bytes received pass the limit. What the client still sends is read
    and dropped by the HTTP server, so it gets the 413 instead of a reset connection."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await error_response(RequestTooLarge(self.max_bytes))(scope, receive, send)
            return
        num_received = 0

        async def receive_within_limit():
            nonlocal num_received
            message = await receive()
            if message["type"] == "http.request":
                num_received += len(message.get("body", b""))
                if num_received > self.max_bytes:
                    raise RequestTooLarge(self.max_bytes)  # the app's handler turns it into the 413
            return message

        await self.app(scope, receive_within_limit, send)


def _content_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses a malformed one before the app sees it
    return None
