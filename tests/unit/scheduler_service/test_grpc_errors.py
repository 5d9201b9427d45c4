"""The one exception -> gRPC status table, and the decorator on sync, async and streaming servicer methods."""

from __future__ import annotations

import grpc
import pytest

from pagedserve.services.grpc_errors import (
    RequestFailed,
    ServiceNotReady,
    WorkerUnavailable,
    map_errors,
    status_code_of,
)
from pagedserve.services.scheduler.admission import Overloaded
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.sampling_params import SamplingParamsError


@pytest.mark.parametrize(("exc", "code"), [
    (SamplingParamsError("bad", "top_p"), grpc.StatusCode.INVALID_ARGUMENT),
    (RequestRejected("too long"), grpc.StatusCode.INVALID_ARGUMENT),
    (ServiceNotReady("loading"), grpc.StatusCode.UNAVAILABLE),
    (WorkerUnavailable("gone"), grpc.StatusCode.UNAVAILABLE),
    (Overloaded("busy", 3), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RequestFailed("nan"), grpc.StatusCode.INTERNAL),
    (KeyError("x"), grpc.StatusCode.INTERNAL),
])
def test_status_codes(exc, code):
    assert status_code_of(exc) is code


class Aborted(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.aborted: tuple | None = None
        self.trailing_metadata: tuple = ()

    def set_trailing_metadata(self, metadata) -> None:
        self.trailing_metadata = metadata

    def abort(self, code, details):
        self.aborted = (code, details)
        raise Aborted


class FakeAsyncContext(FakeContext):
    async def abort(self, code, details, trailing_metadata=()):
        self.trailing_metadata = trailing_metadata
        super().abort(code, details)


class Servicer:
    @map_errors
    def sync_method(self, request, context):
        raise RequestRejected("prompt too long")

    @map_errors
    async def async_method(self, request, context):
        raise ServiceNotReady("not yet")

    @map_errors
    async def stream_method(self, request, context):
        yield 1
        raise WorkerUnavailable("worker gone")


def test_sync_method_aborts_with_the_mapped_status():
    context = FakeContext()
    with pytest.raises(Aborted):
        Servicer().sync_method(None, context)
    assert context.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "prompt too long")


@pytest.mark.asyncio
async def test_async_and_streaming_methods_abort_with_the_mapped_status():
    context = FakeAsyncContext()
    with pytest.raises(Aborted):
        await Servicer().async_method(None, context)
    assert context.aborted == (grpc.StatusCode.UNAVAILABLE, "not yet")
    stream_context, items = FakeAsyncContext(), []
    with pytest.raises(Aborted):
        async for item in Servicer().stream_method(None, stream_context):
            items.append(item)
    assert items == [1] and stream_context.aborted == (grpc.StatusCode.UNAVAILABLE, "worker gone")


class OverloadedServicer:
    @map_errors
    def sync_method(self, request, context):
        raise Overloaded("the server is overloaded", 7)

    @map_errors
    async def async_method(self, request, context):
        raise Overloaded("the server is overloaded", 1, admit_after_s=0.0384)

    @map_errors
    async def stream_method(self, request, context):
        raise ServiceNotReady("draining")
        yield 1


@pytest.mark.asyncio
async def test_errors_with_a_retry_after_send_it_as_trailing_metadata():
    context = FakeContext()
    with pytest.raises(Aborted):
        OverloadedServicer().sync_method(None, context)
    assert context.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.trailing_metadata == (("retry-after-s", "7"),)
    stream_context = FakeAsyncContext()
    with pytest.raises(Aborted):
        async for _ in OverloadedServicer().stream_method(None, stream_context):
            pass
    assert stream_context.aborted[0] is grpc.StatusCode.UNAVAILABLE
    assert stream_context.trailing_metadata == (("retry-after-s", "5"),)


@pytest.mark.asyncio
async def test_an_overload_with_a_refusal_window_sends_it_in_milliseconds():
    context = FakeAsyncContext()
    with pytest.raises(Aborted):
        await OverloadedServicer().async_method(None, context)
    assert context.aborted[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert context.trailing_metadata == (("retry-after-s", "1"), ("admit-after-ms", "38"))
