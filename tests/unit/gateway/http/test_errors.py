"""One place maps errors to OpenAI's JSON: each source of failure gets its status, type, param and code."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest
from fastapi.exceptions import RequestValidationError

from pagedserve.services.gateway.http.errors import OpenAIError, to_openai_error
from pagedserve.shared.sampling_params import SamplingParamsError


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.UNAVAILABLE, 503),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504), (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
])
def test_grpc_status_codes_map_to_http(code, status):
    error = to_openai_error(rpc_error(code, "details here"))
    assert error.status == status
    assert "details here" in error.message


@pytest.mark.parametrize("code", [grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAUTHENTICATED])
def test_internal_failures_are_500_with_the_request_id_and_no_details(code, caplog):
    error = to_openai_error(rpc_error(code, "internal error: IndexError: index 99999 is out of bounds"), "req-42")
    assert (error.status, error.error_type, error.code) == (500, "server_error", "internal_error")
    assert "req-42" in error.message and "IndexError" not in error.message and "99999" not in error.message
    assert "IndexError: index 99999" in caplog.text and "req-42" in caplog.text  # the details go to the log


def test_body_has_exactly_openais_fields():
    body = OpenAIError(404, "The model `x` does not exist.", param="model", code="model_not_found").body()
    assert body == {"error": {"message": "The model `x` does not exist.", "type": "invalid_request_error",
                              "param": "model", "code": "model_not_found"}}


def test_sampling_params_error_keeps_its_param():
    error = to_openai_error(SamplingParamsError("top_p must be in (0, 1], got 2", "top_p"))
    assert (error.status, error.param, error.error_type) == (400, "top_p", "invalid_request_error")


def test_validation_errors_name_the_field_and_are_400():
    error = to_openai_error(RequestValidationError([{"type": "float_parsing", "loc": ("body", "temperature"),
                                                     "msg": "Input should be a valid number"}]))
    assert (error.status, error.param) == (400, "temperature")
    assert error.message == "'temperature': Input should be a valid number"


def test_unexpected_exceptions_are_500_without_internals():
    error = to_openai_error(KeyError("secret"), "req-7")
    assert (error.status, error.error_type) == (500, "server_error")
    assert "secret" not in error.message and "KeyError" not in error.message and "req-7" in error.message
