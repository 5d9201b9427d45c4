"""One trace per request across gateway -> scheduler -> worker, exported over OTLP, spans keyed by req_id."""

from __future__ import annotations

from tests.integration.processes import wait_for

SERVICES = {"pagedserve-gateway", "pagedserve-scheduler", "pagedserve-worker"}


def test_one_trace_spans_the_three_services(http, stack):
    req_id = "traced-request"
    response = http.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3},
                         headers={"X-Request-Id": req_id})
    assert response.status_code == 200 and response.headers["x-request-id"] == req_id

    def request_trace():
        spans = stack.collector.snapshot()
        traces = {s.trace_id for s in spans if s.attributes.get("req_id") == req_id}
        in_trace = [s for s in spans if s.trace_id in traces]
        return in_trace if {s.service for s in in_trace} >= SERVICES else None

    spans = wait_for(request_trace, 10, interval_s=0.2, what="spans of the request from all three services")
    assert len({s.trace_id for s in spans}) == 1, "the request's spans must share one trace"
    names = {(s.service, s.name) for s in spans}
    assert {("pagedserve-gateway", "gateway.generate"), ("pagedserve-scheduler", "scheduler.generate"),
            ("pagedserve-worker", "worker.new_request")} <= names
    keyed = [s for s in spans if s.name in ("gateway.generate", "scheduler.generate", "worker.new_request")]
    assert all(s.attributes["req_id"] == req_id for s in keyed)
