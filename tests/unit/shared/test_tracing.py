"""Tracing set-up follows the OTEL_* variables; trace context survives gRPC metadata and a traceparent string."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from pagedserve.shared.tracing import (
    context_from_traceparent,
    incoming_context,
    outgoing_metadata,
    service_resource,
    setup_tracing,
    traceparent_of,
)


def test_no_exporter_configured_means_no_sdk():
    assert setup_tracing("svc", environ={}) is False
    assert setup_tracing("svc", environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317",
                                         "OTEL_TRACES_EXPORTER": "none"}) is False


def test_context_round_trips_through_metadata_and_traceparent():
    span = TracerProvider().get_tracer("test").start_span("request")
    trace_id = span.get_span_context().trace_id
    traceparent = traceparent_of(span)
    assert traceparent.startswith("00-") and f"{trace_id:032x}" in traceparent
    assert trace.get_current_span(context_from_traceparent(traceparent)).get_span_context().trace_id == trace_id
    with trace.use_span(span):
        metadata = outgoing_metadata()
    assert dict(metadata)["traceparent"] == traceparent
    assert trace.get_current_span(incoming_context(metadata)).get_span_context().span_id == \
        span.get_span_context().span_id


def test_no_span_means_no_metadata():
    assert outgoing_metadata() == [] and traceparent_of(trace.INVALID_SPAN) == ""


def test_otel_service_name_and_resource_attributes_win_over_the_default():
    def name(environ: dict) -> str:
        return service_resource("pagedserve-gateway", environ).attributes["service.name"]

    assert name({}) == "pagedserve-gateway"
    assert name({"OTEL_SERVICE_NAME": "gw-eu-1"}) == "gw-eu-1"
    assert name({"OTEL_RESOURCE_ATTRIBUTES": "service.name=gw-b, deployment.environment=prod"}) == "gw-b"
    resource = service_resource("x", {"OTEL_SERVICE_NAME": "a", "OTEL_RESOURCE_ATTRIBUTES": "service.name=b,k=v"})
    assert (resource.attributes["service.name"], resource.attributes["k"]) == ("a", "v")
