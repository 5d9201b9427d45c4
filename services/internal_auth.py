"""The shared token between services: clients send it as gRPC metadata, servers refuse calls without it.

`--internal-token` / PAGEDSERVE_INTERNAL_TOKEN (empty: no check). Health (grpc.health.v1) stays open, so probes
need no secret. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac

import grpc
import grpc.aio

TOKEN_KEY = "x-pagedserve-token"
_OPEN_PREFIX = "/grpc.health.v1.Health/"
_REFUSED = "missing or wrong internal token (x-pagedserve-token): set the same --internal-token on every service"


def token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Metadata to send with every call (none when the token is empty)."""
    return ((TOKEN_KEY, token),) if token else ()


def _allowed(token: str, details: grpc.HandlerCallDetails) -> bool:
    if not token or details.method.startswith(_OPEN_PREFIX):
        return True
    given = next((value for key, value in details.invocation_metadata or () if key == TOKEN_KEY), "")
    given = given.encode() if isinstance(given, str) else given
    return hmac.compare_digest(given, token.encode())


def _deny_like(handler: grpc.RpcMethodHandler | None, deny_unary, deny_stream) -> grpc.RpcMethodHandler | None:
    """A handler of the same shape as `handler` that refuses the call."""
    if handler is None:
        return None
    options = {"request_deserializer": handler.request_deserializer,
               "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny_unary, **options)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **options)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny_unary, **options)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **options)


class TokenInterceptor(grpc.ServerInterceptor):
    """For the worker's threaded server."""

    def __init__(self, token: str) -> None:
        self.token = token

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if _allowed(self.token, handler_call_details):
            return handler

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSED)

        def deny_stream(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSED)
            yield  # pragma: no cover - abort raises

        return _deny_like(handler, deny, deny_stream)


class AsyncTokenInterceptor(grpc.aio.ServerInterceptor):
    """For the scheduler's asyncio server."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if _allowed(self.token, handler_call_details):
            return handler

        async def deny(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSED)

        async def deny_stream(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _REFUSED)
            yield  # pragma: no cover - abort raises

        return _deny_like(handler, deny, deny_stream)
