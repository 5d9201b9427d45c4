"""Turning choice deltas into responses: SSE framing, usage and the request's span."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from opentelemetry import trace
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse

from services.gateway.admission import Admission
from services.gateway.errors import OpenAIError, to_openai_error
from services.gateway.generation import (
    ChoiceDelta,
    ChoiceJob,
    ChoiceResult,
    collect_choices,
    merge_choices,
    stream_choice,
)
from services.gateway.serving import Serving
from shared.tracing import gen_ai_request_attributes, get_tracer, record_error

log = logging.getLogger(__name__)

STREAM_BUFFER = 64  # deltas a stream may run ahead of its client


class UsageTracker:
    """Usage of a response: prompts counted once each (with the cached tokens of their first choice)."""

    def __init__(self) -> None:
        self._last: dict[int, ChoiceDelta] = {}

    def add(self, delta: ChoiceDelta) -> None:
        self._last[delta.index] = delta

    def usage(self) -> dict:
        first_of_prompt: dict[int, ChoiceDelta] = {}
        for index in sorted(self._last):
            first_of_prompt.setdefault(self._last[index].prompt_index, self._last[index])
        num_prompt = sum(d.num_prompt_tokens for d in first_of_prompt.values())
        num_output = sum(d.num_output_tokens for d in self._last.values())
        return {"prompt_tokens": num_prompt, "completion_tokens": num_output, "total_tokens": num_prompt + num_output,
                "prompt_tokens_details": {"cached_tokens": sum(d.num_cached_tokens for d in first_of_prompt.values())}}


def usage_of(results: list[ChoiceResult]) -> dict:
    tracker = UsageTracker()
    for r in results:
        tracker.add(ChoiceDelta(r.index, r.prompt_index, "", [], r.finish_reason, r.num_prompt_tokens,
                                r.num_cached_tokens, r.num_output_tokens))
    return tracker.usage()


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
        return await _unless_disconnected(request, task, cut)
    finally:
        serving.admission.release(cut)


async def _unless_disconnected(request: Request, future: asyncio.Future, cut: asyncio.Future):
    """The future's result; 499 when the client leaves first, the cut's error when the drain deadline comes first
    (the future is cancelled then, as when the caller is). No polling: a task waits on the request's ASGI channel,
    which carries http.disconnect once the body has been read (Starlette's is_disconnected polls that channel
    through an anyio cancel scope, about 0.3 ms a call: 64 requests waiting seconds for their first token spent
    most of a CPU-second on it)."""
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        done, _ = await asyncio.wait({future, watcher, cut}, return_when=asyncio.FIRST_COMPLETED)
        if future in done:
            return future.result()
        if cut in done:
            raise cut.result()
        raise OpenAIError(499, "client disconnected")
    finally:
        await _cancel(watcher)
        await _cancel(future)


async def _disconnect(request: Request) -> None:
    """Returns when the client has gone (a request's body is read before its generation starts)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel(future: asyncio.Future) -> None:
    """Cancel the future unless it is done, and wait until it is (its own error, if any, is not raised here)."""
    future.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await future


_END = object()  # the pump's last item
_WAKE = object()  # put by a cut, so that a drain waiting for the next delta sees it


@dataclass
class StartedStream:
    """A stream whose first delta has come. Iterate `deltas`; hand `close` to the response as its background task,
    which Starlette runs even when the client left before the body was read (the pump would run on otherwise)."""

    deltas: AsyncIterator[ChoiceDelta]
    pump: asyncio.Task
    cut: asyncio.Future
    admission: Admission

    async def close(self) -> None:
        self.admission.release(self.cut)
        await _cancel(self.pump)


async def first_delta_or_error(request: Request, deltas: AsyncIterator[ChoiceDelta], admission: Admission
                               ) -> StartedStream:
    """Wait for the stream's first delta before any byte of the response is sent, so that a request the scheduler
    refuses (say, more KV cache than the pool holds) gets its own status and a JSON error instead of an error event
    inside a 200; a client that leaves meanwhile cancels the request.

    The deltas run in a task of their own for the whole stream (the request's span is entered there). A cut (the
    drain deadline) ends the stream with its error, before or after the first delta."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=STREAM_BUFFER)
    pump = asyncio.create_task(_pump(deltas, queue))
    cut = admission.cut_signal()
    try:  # one get for the whole wait (a get timed out and retried could drop an item)
        head = await _unless_disconnected(request, asyncio.ensure_future(queue.get()), cut)
        if isinstance(head, Exception):
            raise head
    except BaseException:
        admission.release(cut)
        await _cancel(pump)  # closes the deltas, which aborts their requests
        raise
    cut.add_done_callback(lambda _: _wake(queue))
    return StartedStream(_drain(head, queue, pump, cut), pump, cut, admission)


def _wake(queue: asyncio.Queue) -> None:
    """Wake a drain waiting on an empty queue; a full queue needs no wake (its drain checks the cut per item)."""
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(_WAKE)


async def _pump(deltas: AsyncIterator[ChoiceDelta], queue: asyncio.Queue) -> None:
    try:
        async with contextlib.aclosing(deltas) as stream:
            async for delta in stream:
                await queue.put(delta)
    except Exception as exc:
        await queue.put(exc)
    else:
        await queue.put(_END)


async def _drain(item, queue: asyncio.Queue, pump: asyncio.Task, cut: asyncio.Future
                 ) -> AsyncIterator[ChoiceDelta]:
    try:
        while item is not _END:
            if cut.done():
                raise cut.result()
            if isinstance(item, Exception):
                raise item
            if item is not _WAKE:
                yield item
            item = await queue.get()
    finally:
        await _cancel(pump)


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def sse_error(exc: BaseException, req_id: str | None = None) -> str:
    """The error event: ASCII-escaped, since its message may quote the client's input."""
    return f"data: {json.dumps(to_openai_error(exc, req_id).body())}\n\n"


SSE_DONE = "data: [DONE]\n\n"


async def sse_events(deltas: AsyncIterator[ChoiceDelta], head: list[dict],
                     to_chunk: Callable[[ChoiceDelta], str | dict | list[dict]],
                     usage_chunk: Callable[[dict], dict] | None, req_id: str | None = None) -> AsyncIterator[str]:
    """`head` chunks, the chunk (or chunks) of each delta, the usage chunk when asked, then [DONE]; errors as an
    error event. `to_chunk` may return a chunk already encoded as JSON (a str; see sse_template.py)."""
    for chunk in head:
        yield sse(chunk)
    tracker = UsageTracker()
    try:
        async with contextlib.aclosing(deltas) as stream:
            async for delta in stream:
                tracker.add(delta)
                chunks = to_chunk(delta)
                if isinstance(chunks, str):
                    yield f"data: {chunks}\n\n"
                    continue
                for chunk in chunks if isinstance(chunks, list) else [chunks]:
                    yield sse(chunk)
    except Exception as exc:  # the status line is gone: report in the stream, as OpenAI does
        yield sse_error(exc, req_id)
    else:
        if usage_chunk is not None:
            yield sse(usage_chunk(tracker.usage()))
    yield SSE_DONE


class _ClientGone(Exception):
    """The client's connection is gone: the stream ends at its next write."""


class StallGuardedStream(StreamingResponse):
    """An SSE response that gives up on a client that stops reading or goes away.

    Stalled: when one write waits longer than `stall_timeout_s` for the client to take data (the socket and the
    server's write buffer are full), the stream ends there, the connection is closed and the background task aborts
    the request, freeing its KV blocks. Only a write that waits counts: a client that keeps up with generation never
    makes one wait. One slower than that fills the buffers, and then must take about a third of the kernel's send
    buffer (Linux wakes a waiting writer only then; the buffer grows up to 4 MiB) within the timeout.

    Gone: once the HTTP server reports the disconnect, the next write ends the stream. The server drops writes to a
    lost connection without waiting, so a stream whose task missed the cancellation would otherwise run on, with
    nothing to stall it, until its request finished."""

    def __init__(self, events: AsyncIterator[str], stream: StartedStream, req_id: str, stall_timeout_s: float,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"X-Request-Id": req_id, **(headers or {})},
                         background=BackgroundTask(stream.close))
        self.req_id = req_id
        self.stall_timeout_s = stall_timeout_s
        self.client_gone = False

    async def listen_for_disconnect(self, receive) -> None:
        await super().listen_for_disconnect(receive)
        self.client_gone = True

    async def stream_response(self, send) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as stall:
                async def send_or_stall(message) -> None:
                    if self.client_gone:
                        raise _ClientGone
                    stall.reschedule(loop.time() + self.stall_timeout_s)
                    await send(message)
                    stall.reschedule(None)

                await super().stream_response(send_or_stall)
        except _ClientGone:
            log.info("req_id=%s: the client went away: stream aborted", self.req_id)
        except TimeoutError:  # the response stays incomplete: the server closes the connection when we return
            log.warning("req_id=%s: the client read nothing for %g s: stream aborted", self.req_id,
                        self.stall_timeout_s)
