"""Streaming OpenAI-compatible HTTP client that timestamps every chunk.

aiohttp, as `vllm bench serve` uses: the client shares the machine with the server under test, and on the 2-core
CI machine httpx's stream machinery took about 0.22 ms of CPU a chunk (1.9 s over a 64-stream run of 8,300 chunks),
time taken from the server on every benchmark.
"""

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.payload import EndpointConfig, build_payload
from pagedserve.benchmarks.records import RequestRecord

_MAX_ERROR_BODY_CHARS = 500
_READ_BUFFER_BYTES = 2**20  # an SSE line may be this long (a chunk with many logprobs)
HttpError = (aiohttp.ClientError, asyncio.TimeoutError)  # what a GET to the server may raise


class StreamError(Exception):
    """The server sent an error object or unparseable data inside a 200 stream."""


def make_http_client(cfg: EndpointConfig) -> aiohttp.ClientSession:
    """No connection cap (the load point's semaphore is the cap); no proxy from the environment (skews timings).
    Each read may wait up to the request timeout (send_request also bounds the whole request by it)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(cfg.request_timeout_s, 30.0),
                                    sock_read=cfg.request_timeout_s)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout, headers=cfg.headers,
                                 trust_env=False, read_bufsize=_READ_BUFFER_BYTES)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    text: str

    def json(self) -> object:
        return json.loads(self.text)


async def get(client: aiohttp.ClientSession, url: str) -> Reply:
    """A whole GET response; raises one of HttpError."""
    async with client.get(url) as response:
        text = await response.text(errors="replace")
        return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, text)


async def send_request(
    client: aiohttp.ClientSession,
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
    except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors too
        connecting = isinstance(exc, aiohttp.ConnectionTimeoutError)
        _fail(record, "connection" if connecting else "timeout", repr(exc))
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # refused/reset, or cut mid-way
        _fail(record, "connection" if record.http_status is None else "incomplete_stream", repr(exc))
    except (StreamError, aiohttp.ClientError, ValueError) as exc:  # an error object mid-stream, undecodable data
        _fail(record, "stream_error", str(exc) or repr(exc))
    record.e2el_s = record.e2el_s or time.perf_counter() - start_s
    return record


async def _stream(
    client: aiohttp.ClientSession, cfg: EndpointConfig, request: BenchRequest, record: RequestRecord, start_s: float
) -> str:
    """Read the SSE stream; returns the generated text. Sets record.error for HTTP errors and cut streams."""
    pieces: list[str] = []
    done = False
    async with client.post(cfg.url, json=build_payload(cfg, request)) as response:
        record.http_status = response.status
        record.replica = response.headers.get("X-Pagedserve-Replica")
        if response.status != 200:
            body = await response.text(errors="replace")
            _fail(record, f"http_{response.status}", body[:_MAX_ERROR_BODY_CHARS])
            return ""
        async for line in response.content:  # lines, with their b"\n"
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            data = line[len(b"data:") :].strip()
            if data == b"[DONE]":
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


def _parse(data: bytes) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError as exc:  # not JSON, or not UTF-8
        raise StreamError(f"unparseable chunk: {data[:_MAX_ERROR_BODY_CHARS].decode(errors='replace')}") from exc
    if not isinstance(chunk, dict) or "error" in chunk:
        raise StreamError(f"error in stream: {data[:_MAX_ERROR_BODY_CHARS].decode(errors='replace')}")
    return chunk


def _read_chunk(chunk: dict, record: RequestRecord) -> str:
    """Text carried by a chat or completions chunk; records usage and finish_reason on the way."""
    usage = chunk.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        record.num_output_tokens = usage["completion_tokens"]
        record.output_tokens_source = "usage"
        record.num_prompt_tokens = usage.get("prompt_tokens", record.num_prompt_tokens)
        record.num_cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
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
