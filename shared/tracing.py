"""OpenTelemetry set-up and context propagation, the same for the three services.

Exporter choice follows the standard variables: OTLP over gRPC when OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, the console with OTEL_TRACES_EXPORTER=console, and otherwise none:
the API's no-op tracer then makes every span free. Trace context travels in gRPC metadata (W3C `traceparent`);
a worker step serves many requests, so each new request carries its own traceparent inside the step.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Status, StatusCode

from pagedserve.shared.sampling_params import SamplingParams

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

TRACER_NAME = "pagedserve"
_TRACEPARENT = "traceparent"


def setup_tracing(service_name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Install an SDK tracer provider when an exporter is configured; True when spans are exported.

    `service_name` is the default: OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) wins, and the
    SDK reads the other standard variables itself (OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_*)."""
    environ = os.environ if environ is None else environ
    exporter_name = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    has_endpoint = bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    if exporter_name == "none" or (not has_endpoint and exporter_name not in ("otlp", "console")):
        return False
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself
    provider = TracerProvider(resource=service_resource(service_name, environ))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def service_resource(default_name: str, environ: Mapping[str, str]) -> Resource:
    """The process's OTel resource: OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME (as the SDK reads them), with
    `default_name` as service.name only when neither names the service."""
    from opentelemetry.sdk.resources import Resource

    attributes = dict(item.strip().split("=", 1) for item in environ.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
                      if "=" in item)
    attributes["service.name"] = environ.get("OTEL_SERVICE_NAME") or attributes.get("service.name") or default_name
    return Resource.create(attributes)


def shutdown_tracing() -> None:
    """Flush spans still queued (no-op without an SDK provider)."""
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()


def get_tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def outgoing_metadata() -> list[tuple[str, str]]:
    """gRPC metadata carrying the current trace context (empty when there is no valid span)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def incoming_context(metadata: Iterable[tuple[str, str | bytes]] | None) -> context.Context:
    """The trace context a gRPC caller sent in its metadata."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    return propagate.extract(carrier)


def traceparent_of(span: trace.Span) -> str:
    """The W3C traceparent of a span ('' when it is not a valid, e.g. no-op, span)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(_TRACEPARENT, "")


def context_from_traceparent(traceparent: str) -> context.Context:
    return propagate.extract({_TRACEPARENT: traceparent})


def record_error(span: trace.Span, exc: BaseException) -> None:
    """Mark a span failed: ERROR status, `error.type` (semantic conventions) and the exception as an event."""
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def gen_ai_request_attributes(sampling: SamplingParams) -> dict[str, int | float]:
    """The OpenTelemetry GenAI semantic-convention attributes of a request's sampling parameters."""
    attributes: dict[str, int | float] = {"gen_ai.request.max_tokens": sampling.max_tokens,
                                          "gen_ai.request.temperature": sampling.temperature,
                                          "gen_ai.request.top_p": sampling.top_p}
    if sampling.top_k and sampling.top_k > 0:
        attributes["gen_ai.request.top_k"] = sampling.top_k
    if sampling.seed is not None:
        attributes["gen_ai.request.seed"] = sampling.seed
    if sampling.presence_penalty:
        attributes["gen_ai.request.presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        attributes["gen_ai.request.frequency_penalty"] = sampling.frequency_penalty
    return attributes
