"""Running a request's choices inside its span (GenAI semantic conventions), and collecting a non-streaming
request's results unless its client leaves or the drain cuts it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from opentelemetry import trace
from starlette.requests import Request

from pagedserve.services.gateway.api.disconnect import unless_disconnected
from pagedserve.services.gateway.api.generation import (
    ChoiceDelta,
    ChoiceJob,
    ChoiceResult,
    collect_choices,
    merge_choices,
    stream_choice,
)
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.api.sse import sse_events
from pagedserve.services.gateway.api.stream_response import StallGuardedStream, first_delta_or_error
from pagedserve.services.gateway.api.usage import UsageTracker
from pagedserve.services.gateway.tenants.current import current_tenant
from pagedserve.shared.tracing import gen_ai_request_attributes, get_tracer, record_error

_OPERATIONS = {"chat": "chat", "completions": "text_completion"}  # endpoint -> gen_ai.operation.name
REPLICA_HEADER = "X-Pagedserve-Replica"


def replica_header(served_by: list[str]) -> dict[str, str]:
    """X-Pagedserve-Replica: the replicas serving the request's choices so far (ids, comma-separated)."""
    return {REPLICA_HEADER: ",".join(dict.fromkeys(served_by))} if served_by else {}


async def run_choices(serving: Serving, jobs: list[ChoiceJob], endpoint: str, req_id: str,
                      served_by: list[str] | None = None) -> AsyncIterator[ChoiceDelta]:
    """All deltas of the request's choices inside the request's span (GenAI semantic conventions; ERROR status
    when the request fails); the replicas serving them are appended to `served_by` at each choice's first output."""
    served_by = [] if served_by is None else served_by
    tracker = UsageTracker()
    operation, model_name = _OPERATIONS[endpoint], serving.description.model_name
    span = get_tracer().start_span(f"{operation} {model_name}", attributes={
        "req_id": req_id, "gen_ai.operation.name": operation, "gen_ai.provider.name": "pagedserve",
        "gen_ai.request.model": model_name, "gen_ai.request.choice.count": len(jobs),
        "pagedserve.tenant": jobs[0].request.tenant, "pagedserve.priority": jobs[0].request.priority,
        **gen_ai_request_attributes(jobs[0].request.sampling)})
    finish_reasons: list[str] = []
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        try:
            streams = [stream_choice(serving.router, serving.tokenizer, job, served_by) for job in jobs]
            async with contextlib.aclosing(merge_choices(streams)) as deltas:
                async for delta in deltas:
                    tracker.add(delta)
                    if delta.finish_reason:
                        finish_reasons.append(delta.finish_reason)
                    yield delta
        except Exception as exc:
            record_error(span, exc)
            raise
        finally:
            span.set_attribute("pagedserve.replicas", ",".join(dict.fromkeys(served_by)))
            usage = tracker.usage()
            serving.spend_tokens(current_tenant(), usage["prompt_tokens"], usage["completion_tokens"],
                                 usage["prompt_tokens_details"]["cached_tokens"])
        span.set_attributes({"gen_ai.response.model": model_name, "gen_ai.response.finish_reasons": finish_reasons,
                             "gen_ai.usage.input_tokens": usage["prompt_tokens"],
                             "gen_ai.usage.output_tokens": usage["completion_tokens"],
                             "num_cached_tokens": usage["prompt_tokens_details"]["cached_tokens"]})


async def collect_until_disconnect(request: Request, serving: Serving, jobs: list[ChoiceJob], endpoint: str,
                                   req_id: str, served_by: list[str] | None = None) -> list[ChoiceResult]:
    """Run a non-streaming request; if the client goes away meanwhile, or the drain deadline cuts it, cancel it
    (aborting every choice)."""
    cut = serving.admission.cut_signal()
    try:
        task = asyncio.create_task(collect_choices(run_choices(serving, jobs, endpoint, req_id, served_by), jobs))
        return await unless_disconnected(request, task, cut)
    finally:
        serving.admission.release(cut)


async def stream_choices(request, serving: Serving, jobs, endpoint: str, req_id: str, head: list[dict], to_chunk,
                         usage_chunk) -> StallGuardedStream:
    """The choices run and streamed as SSE events (the first delta, or the error before it, decides the status),
    the stream cut if it stalls; the replica that served it named in a header."""
    served_by: list[str] = []
    stream = await first_delta_or_error(request, run_choices(serving, jobs, endpoint, req_id, served_by),
                                        serving.admission)
    events = sse_events(stream.deltas, head, to_chunk, usage_chunk, req_id)
    return StallGuardedStream(events, stream, req_id, serving.config.stream_stall_timeout_s,
                              replica_header(served_by))
