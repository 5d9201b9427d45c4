"""The one place that maps errors to OpenAI's JSON shape and HTTP status: {"error": {message, type, param, code}}.

Every 429 and 503 carries `Retry-After` (seconds): the scheduler's own estimate when it sent one (trailing gRPC
metadata `retry-after-s`), else DEFAULT_RETRY_AFTER_S.
"""

from __future__ import annotations

import json
import logging

import grpc
import grpc.aio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedserve.shared.sampling_params import SamplingParamsError

log = logging.getLogger(__name__)

RETRY_AFTER_METADATA = "retry-after-s"  # trailing metadata of a RESOURCE_EXHAUSTED / UNAVAILABLE status
ADMIT_AFTER_METADATA = "admit-after-ms"  # trailing metadata of a RESOURCE_EXHAUSTED: arrivals refused this long
MAX_ADMIT_AFTER_S = 1.0  # a replica's promise is trusted this long at most
DEFAULT_RETRY_AFTER_S = 1
_RETRYABLE = (429, 503)

_GRPC_TO_HTTP = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 429: "rate_limit_error"}


class RequestTooLarge(StarletteHTTPException):
    """A request body over the gateway's limit. An HTTP exception, so that FastAPI passes it on unchanged when it
    is raised from inside the body read (it turns any other error there into a 400)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(413, f"The request body is larger than this server's limit of {limit_bytes} bytes.")


class OpenAIError(Exception):
    """An error answered to the client as it is; raise it anywhere in the gateway."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        if retry_after_s is None and status in _RETRYABLE:
            retry_after_s = DEFAULT_RETRY_AFTER_S
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def _from_validation(exc: RequestValidationError) -> OpenAIError:
    first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"Malformed JSON in the request body: {first.get('msg')}", code="invalid_json")
    param = ".".join(loc) or None
    where = f"'{param}': " if param else ""
    if (first.get("ctx") or {}).get("param"):  # a whole-body check that names the field itself
        param, where = first["ctx"]["param"], ""
    message = str(first.get("msg")).removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return OpenAIError(400, f"{where}{message}", param=param, code="invalid_value")


def _trailing(exc: grpc.aio.AioRpcError, name: str) -> str | None:
    """The first value of a trailing metadata key of a failed call; None when absent."""
    return next((value for key, value in exc.trailing_metadata() or () if key == name), None)


def _retry_after_s(exc: grpc.aio.AioRpcError) -> int | None:
    """The scheduler's `retry-after-s` trailing metadata as whole seconds (at least 1); None when absent or bad."""
    value = _trailing(exc, RETRY_AFTER_METADATA)
    try:
        return None if value is None else max(1, int(float(value)))
    except (TypeError, ValueError, OverflowError):
        return None


def admit_after_s(exc: grpc.aio.AioRpcError) -> float:
    """The scheduler's `admit-after-ms` trailing metadata in seconds, at most MAX_ADMIT_AFTER_S; 0 when absent or
    bad."""
    try:
        seconds = float(_trailing(exc, ADMIT_AFTER_METADATA) or 0) / 1000
    except (TypeError, ValueError):
        return 0.0
    return min(MAX_ADMIT_AFTER_S, seconds) if seconds > 0 else 0.0  # NaN too fails `> 0`


def internal_error(req_id: str | None) -> OpenAIError:
    """What a client sees of a failure inside the server: no exception text, the request id to quote."""
    where = f" (request id {req_id})" if req_id else ""
    return OpenAIError(500, f"The server had an error while processing your request{where}; the details are in "
                            "the server's log.", code="internal_error")


def to_openai_error(exc: BaseException, req_id: str | None = None) -> OpenAIError:
    """`req_id` names the request in the message of a 500, whose details go to the log only."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, SamplingParamsError):
        return OpenAIError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, RequestValidationError):
        return _from_validation(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        status = _GRPC_TO_HTTP.get(exc.code(), 500)
        if status == 500:  # INTERNAL, UNKNOWN, UNAUTHENTICATED (a token mismatch between services), ...
            log.error("request %s: the scheduler call failed: %s: %s", req_id, exc.code().name, exc.details())
            return internal_error(req_id)
        message = exc.details() or exc.code().name
        code = {429: "rate_limit_exceeded", 503: "service_unavailable"}.get(status)
        if status == 503:
            message = f"the scheduler is unavailable: {message}"
        return OpenAIError(status, message, code=code, retry_after_s=_retry_after_s(exc))
    if isinstance(exc, StarletteHTTPException):
        code = "request_too_large" if exc.status_code == 413 else None
        return OpenAIError(exc.status_code, str(exc.detail), code=code)
    log.error("request %s: unexpected error", req_id, exc_info=exc)
    return internal_error(req_id)


class ErrorJSONResponse(JSONResponse):
    """ASCII-escaped JSON: an error that quotes the client's input renders whatever that input holds."""

    def render(self, content) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(exc: BaseException, headers: dict[str, str] | None = None, req_id: str | None = None
                   ) -> JSONResponse:
    error = to_openai_error(exc, req_id)
    return ErrorJSONResponse(error.body(), status_code=error.status, headers={**error.headers, **(headers or {})})


class ErrorBoundary:
    """Outermost app middleware: an exception no handler took becomes a 500 JSON response here, so the connection
    stays usable (Starlette's last-resort handler re-raises, and the server then drops the connection, which a
    pooled client sees as a reset on its next request). After the response started the error is re-raised: only
    closing the connection can tell the client its body is cut."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def note_start(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, note_start)
        except Exception as exc:
            if started:
                raise
            await error_response(exc, req_id=scope.get("state", {}).get("req_id"))(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        headers = exc.headers if isinstance(exc, StarletteHTTPException) else None  # e.g. a 405's Allow
        return error_response(exc, headers, getattr(request.state, "req_id", None))

    for exc_type in (OpenAIError, SamplingParamsError, RequestValidationError, grpc.aio.AioRpcError,
                     StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)
