"""SSE framing of a response: `data:` events, the error event, the usage chunk and [DONE]."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable

from pagedserve.services.gateway.api.generation import ChoiceDelta
from pagedserve.services.gateway.api.usage import UsageTracker
from pagedserve.services.gateway.http.errors import to_openai_error


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
