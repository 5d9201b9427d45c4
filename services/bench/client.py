"""Streaming OpenAI-compatible HTTP client that timestamps every chunk."""

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from services.bench.datasets import BenchRequest
from services.bench.payload import EndpointConfig, build_payload
from services.bench.records import RequestRecord

_MAX_ERROR_BODY_CHARS = 500
_MAX_KEEPALIVE_CONNECTIONS = 1024


class StreamError(Exception):
    """The server sent an error object or unparseable data inside a 200 stream."""


def make_http_client(cfg: EndpointConfig) -> httpx.AsyncClient:
    """No connection cap (the load point's semaphore is the cap); no proxy from the environment (skews timings)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=_MAX_KEEPALIVE_CONNECTIONS)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=min(cfg.request_timeout_s, 30.0))
    return httpx.AsyncClient(timeout=timeout, limits=limits, headers=cfg.headers, trust_env=False)


async def send_request(
    client: httpx.AsyncClient,
    cfg: EndpointConfig,
    request: BenchRequest,
    record: RequestRecord,
    count_tokens: Callable[[str], int] | None,
) -> RequestRecord:
    """Send one streaming request and fill `record`; never raises for server or network failures."""
    record.num_prompt_tokens = request.num_prompt_tokens
    start_s = time.perf_counter()
    try:
        text = await asyncio.wait_for(_stream(client, cfg, request, record, start_s), cfg.request_timeout_s)
        _finish(record, text, count_tokens)
    except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
        connecting = isinstance(exc, httpx.ConnectTimeout)
        _fail(record, "connection" if connecting else "timeout", repr(exc))
    except httpx.TransportError as exc:  # connect refused/reset before a response, or a stream cut mid-way
        _fail(record, "connection" if record.http_status is None else "incomplete_stream", repr(exc))
    except (StreamError, httpx.HTTPError) as exc:  # e.g. an error object mid-stream, or undecodable content
        _fail(record, "stream_error", str(exc) or repr(exc))
    record.e2el_s = record.e2el_s or time.perf_counter() - start_s
    return record


async def _stream(
    client: httpx.AsyncClient, cfg: EndpointConfig, request: BenchRequest, record: RequestRecord, start_s: float
) -> str:
    """Read the SSE stream; returns the generated text. Sets record.error for HTTP errors and cut streams."""
    pieces: list[str] = []
    done = False
    async with client.stream("POST", cfg.url, json=build_payload(cfg, request)) as response:
        record.http_status = response.status_code
        if response.status_code != 200:
            body = (await response.aread()).decode(errors="replace")
            _fail(record, f"http_{response.status_code}", body[:_MAX_ERROR_BODY_CHARS])
            return ""
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, event: lines
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                done = True
                break
            text = _read_chunk(_parse(data), record)
            if text:
                record.chunk_times_s.append(time.perf_counter() - start_s)
                pieces.append(text)
    record.e2el_s = time.perf_counter() - start_s
    if not done and record.finish_reason is None:
        _fail(record, "incomplete_stream", "stream ended without [DONE] or finish_reason")
    return "".join(pieces)


def _parse(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise StreamError(f"unparseable chunk: {data[:_MAX_ERROR_BODY_CHARS]}") from exc
    if not isinstance(chunk, dict) or "error" in chunk:
        raise StreamError(f"error in stream: {data[:_MAX_ERROR_BODY_CHARS]}")
    return chunk


def _read_chunk(chunk: dict, record: RequestRecord) -> str:
    """Text carried by a chat or completions chunk; records usage and finish_reason on the way."""
    usage = chunk.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        record.num_output_tokens = usage["completion_tokens"]
        record.output_tokens_source = "usage"
        record.num_prompt_tokens = usage.get("prompt_tokens", record.num_prompt_tokens)
    text = ""
    for choice in chunk.get("choices") or []:
        record.finish_reason = choice.get("finish_reason") or record.finish_reason
        delta = choice.get("delta") or {}
        text += choice.get("text") or ""
        text += delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
    return text


def _finish(record: RequestRecord, text: str, count_tokens: Callable[[str], int] | None) -> None:
    if not record.ok:
        return
    if not record.chunk_times_s:
        _fail(record, "no_tokens", "stream finished without generated text")
    elif record.output_tokens_source is None:
        record.output_tokens_source = "tokenizer" if count_tokens else "chunks"
        record.num_output_tokens = count_tokens(text) if count_tokens else len(record.chunk_times_s)


def _fail(record: RequestRecord, kind: str, detail: str) -> None:
    if record.error is None:  # keep the first cause
        record.error, record.error_detail = kind, detail
