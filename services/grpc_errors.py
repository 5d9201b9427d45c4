"""The one place that maps exceptions to gRPC status codes, for every servicer (sync and asyncio).

Exceptions are matched by qualified class name along the MRO, so this module needs no import of the worker
(torch) or the scheduler to know their errors.
"""

from __future__ import annotations

import functools
import inspect
import logging

import grpc
import grpc.aio

log = logging.getLogger(__name__)


RETRY_AFTER_KEY = "retry-after-s"  # trailing metadata: whole seconds a client should wait before retrying
ADMIT_AFTER_KEY = "admit-after-ms"  # trailing metadata: milliseconds in which further arrivals would be refused too


class ServiceNotReady(RuntimeError):
    """The service is up but not serving (model loading, waiting for the worker, draining)."""

    retry_after_s = 5  # a worker loading or a replacement coming up: seconds, not minutes


class WorkerUnavailable(RuntimeError):
    """The worker failed or went away during a step; requests in flight are lost."""

    retry_after_s = 5


class RequestFailed(RuntimeError):
    """The worker failed on this one request (numeric trouble, a sampler error); its step-mates went on."""


_CODES = {
    "pagedserve.shared.sampling_params.SamplingParamsError": grpc.StatusCode.INVALID_ARGUMENT,
    "pagedserve.services.scheduler.scheduler.RequestRejected": grpc.StatusCode.INVALID_ARGUMENT,
    "pagedserve.services.grpc_errors.ServiceNotReady": grpc.StatusCode.UNAVAILABLE,
    "pagedserve.services.grpc_errors.WorkerUnavailable": grpc.StatusCode.UNAVAILABLE,
    "pagedserve.services.grpc_errors.RequestFailed": grpc.StatusCode.INTERNAL,
    "pagedserve.services.scheduler.admission.Overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "pagedserve.shared.grammar_cache.GrammarError": grpc.StatusCode.INVALID_ARGUMENT,
}


def status_code_of(exc: BaseException) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        code = _CODES.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def _status(exc: Exception, method: str) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """(code, details, trailing metadata): `retry-after-s` for errors that carry a `retry_after_s`, `admit-after-ms`
    for those that carry a positive `admit_after_s`."""
    code = status_code_of(exc)
    retry_after_s = getattr(exc, "retry_after_s", None)
    metadata = ((RETRY_AFTER_KEY, str(int(retry_after_s))),) if retry_after_s is not None else ()
    admit_after_s = getattr(exc, "admit_after_s", 0.0)
    if admit_after_s > 0:
        metadata += ((ADMIT_AFTER_KEY, str(round(admit_after_s * 1000))),)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
        return code, f"internal error: {type(exc).__name__}: {exc}", metadata
    return code, str(exc), metadata


def _passes_through(exc: Exception) -> bool:
    """Errors raised by context.abort() (or a nested call) already carry their status."""
    return isinstance(exc, grpc.RpcError | grpc.aio.AbortError)


def map_errors(method):
    """Decorate a servicer method (sync, async, or a generator of either kind) so exceptions become gRPC statuses."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream_wrapper(self, request, context):
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as exc:
                if _passes_through(exc):
                    raise
                code, details, metadata = _status(exc, method.__name__)
                await context.abort(code, details, trailing_metadata=metadata)
        return stream_wrapper
    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def sync_stream_wrapper(self, request, context):
            try:
                yield from method(self, request, context)
            except Exception as exc:
                if _passes_through(exc):
                    raise
                _abort(context, *_status(exc, method.__name__))
        return sync_stream_wrapper
    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def async_wrapper(self, request, context):
            try:
                return await method(self, request, context)
            except Exception as exc:
                if _passes_through(exc):
                    raise
                code, details, metadata = _status(exc, method.__name__)
                await context.abort(code, details, trailing_metadata=metadata)
        return async_wrapper

    @functools.wraps(method)
    def sync_wrapper(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:
            if _passes_through(exc):
                raise
            _abort(context, *_status(exc, method.__name__))
    return sync_wrapper


def _abort(context, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...]) -> None:
    """A sync servicer's abort: the trailing metadata is set first (its abort takes none)."""
    if metadata:
        context.set_trailing_metadata(metadata)
    context.abort(code, details)
