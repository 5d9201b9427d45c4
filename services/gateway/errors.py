"""The one place that maps errors to OpenAI's JSON shape and HTTP status: {"error": {message, type, param, code}}."""

from __future__ import annotations

import logging

import grpc
import grpc.aio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.sampling_params import SamplingParamsError

log = logging.getLogger(__name__)

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


class OpenAIError(Exception):
    """An error answered to the client as it is; raise it anywhere in the gateway."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.code}}


def _from_validation(exc: RequestValidationError) -> OpenAIError:
    first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return OpenAIError(400, f"Malformed JSON in the request body: {first.get('msg')}", code="invalid_json")
    param = ".".join(loc) or None
    where = f"'{param}': " if param else ""
    return OpenAIError(400, f"{where}{first.get('msg')}", param=param, code="invalid_value")


def to_openai_error(exc: BaseException) -> OpenAIError:
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, SamplingParamsError):
        return OpenAIError(400, str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, RequestValidationError):
        return _from_validation(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        status = _GRPC_TO_HTTP.get(exc.code(), 500)
        message = exc.details() or exc.code().name
        if status == 503:
            message = f"the scheduler is unavailable: {message}"
        return OpenAIError(status, message, code="service_unavailable" if status == 503 else None)
    if isinstance(exc, StarletteHTTPException):
        return OpenAIError(exc.status_code, str(exc.detail))
    log.exception("unexpected error", exc_info=exc)
    return OpenAIError(500, f"internal server error: {type(exc).__name__}")


def error_response(exc: BaseException) -> JSONResponse:
    error = to_openai_error(exc)
    return JSONResponse(error.body(), status_code=error.status)


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for exc_type in (OpenAIError, SamplingParamsError, RequestValidationError, grpc.aio.AioRpcError,
                     StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, handle)
