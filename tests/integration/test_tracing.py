"""One trace per request across gateway -> scheduler -> worker, received over OTLP by an in-process receiver:
the parent chain, the request's events on the scheduler span, GenAI attributes, and ERROR status on failure."""

from __future__ import annotations

from tests.integration.processes import CollectedSpan, wait_for

SERVICES = {"pagedserve-gateway", "pagedserve-scheduler", "pagedserve-worker"}


def request_spans(stack, req_id: str, services: set[str]) -> list[CollectedSpan]:
    def collected():
        spans = stack.collector.snapshot()
        traces = {s.trace_id for s in spans if s.attributes.get("req_id") == req_id}
        in_trace = [s for s in spans if s.trace_id in traces]
        return in_trace if {s.service for s in in_trace} >= services else None

    return wait_for(collected, 15, interval_s=0.2, what=f"spans of {req_id} from {sorted(services)}")


def test_one_trace_spans_the_three_services_with_the_request_events(http, stack, model_name):
    req_id = "traced-request"
    response = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3},
                         headers={"X-Request-Id": req_id})
    assert response.status_code == 200 and response.headers["x-request-id"] == req_id
    spans = request_spans(stack, req_id, SERVICES)
    assert len({s.trace_id for s in spans}) == 1, "the request's spans must share one trace"
    by_name = {s.name: s for s in spans}
    http_span = by_name["POST /v1/completions"]  # FastAPI's server span: the root
    gateway = by_name[f"text_completion {model_name}"]
    scheduler, worker = by_name["scheduler.generate"], by_name["worker.new_request"]
    assert http_span.parent_span_id == ""
    assert gateway.parent_span_id == http_span.span_id and gateway.service == "pagedserve-gateway"
    assert scheduler.parent_span_id == gateway.span_id and scheduler.service == "pagedserve-scheduler"
    assert worker.parent_span_id == scheduler.span_id and worker.service == "pagedserve-worker"
    assert all(s.attributes["req_id"] == req_id for s in (gateway, scheduler, worker))
    assert not [s for s in spans if s.name in ("scheduler.step", "worker.step")], "steps are not in request traces"

    events = [name for name, _ in scheduler.events]
    assert events[:2] == ["queued", "scheduled"] and events[-2:] == ["first_token", "finished"] or \
        events[-1] == "finished", events
    assert events.index("prefill_chunk") < events.index("first_token") < events.index("finished")
    attributes = dict(scheduler.events)
    assert attributes["scheduled"]["num_cached_tokens"] >= 0 and attributes["finished"]["finish_reason"] == "length"
    assert attributes["queued"]["num_prompt_tokens"] == gateway.attributes["gen_ai.usage.input_tokens"]
    assert gateway.attributes["gen_ai.operation.name"] == "text_completion"
    assert gateway.attributes["gen_ai.request.model"] == gateway.attributes["gen_ai.response.model"] == model_name
    assert (gateway.attributes["gen_ai.request.max_tokens"], gateway.attributes["gen_ai.usage.output_tokens"]) == (3, 3)
    assert gateway.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert scheduler.attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert gateway.status_code == scheduler.status_code == 0  # unset: no error


def test_a_failed_request_is_an_error_in_every_span_it_reached(http, stack):
    """The scheduler refuses a second live request with the same id: that request's spans end in ERROR."""
    req_id = "duplicate-id"
    body = {"prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body, headers={"X-Request-Id": req_id}) as live:
        lines = live.iter_lines()  # kept: a dropped iterator would close the stream and abort the request
        next(lines)  # the first request is running in the scheduler
        refused = http.post("/v1/completions", json={**body, "stream": False}, headers={"X-Request-Id": req_id})
    assert refused.status_code == 400 and "already in use" in refused.text

    def failed_trace():
        spans = [s for s in stack.collector.snapshot() if s.attributes.get("req_id") == req_id]
        errors = {s.trace_id for s in spans if s.name == "scheduler.generate" and s.status_code == 2}
        in_trace = [s for s in spans if s.trace_id in errors]
        return in_trace if len(in_trace) >= 2 else None

    failed = {s.name.split(" ")[0]: s for s in wait_for(failed_trace, 15, interval_s=0.2, what="the failed trace")}
    assert failed["scheduler.generate"].attributes["error.type"] == "RequestRejected"
    assert failed["text_completion"].status_code == 2 and failed["text_completion"].attributes["error.type"]
