"""Drive one load point: send requests on the arrival schedule under the concurrency cap, and time the run."""

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
import numpy as np
from tqdm import tqdm

from pagedserve.benchmarks.client import send_request
from pagedserve.benchmarks.datasets import BenchRequest
from pagedserve.benchmarks.load import LoadPoint, arrival_offsets_s
from pagedserve.benchmarks.metrics import MetricsConfig, compute_metrics
from pagedserve.benchmarks.payload import EndpointConfig
from pagedserve.benchmarks.prometheus import MetricsWatcher
from pagedserve.benchmarks.records import RequestRecord


@dataclass
class RunResult:
    point: LoadPoint
    seed: int  # dataset and arrival seed of this point
    started_at: str  # ISO 8601, UTC
    metrics: dict  # compute_metrics() output
    server_metrics: dict | None  # MetricsWatcher report; None when the server has no /metrics
    records: list[RequestRecord]


@dataclass(frozen=True)
class RunOptions:
    metrics: MetricsConfig
    metrics_url: str | None = None  # None: do not scrape
    poll_interval_s: float = 0.5
    show_progress: bool = True


async def run_point(
    client: aiohttp.ClientSession,
    cfg: EndpointConfig,
    requests: list[BenchRequest],
    point: LoadPoint,
    seed: int,
    options: RunOptions,
    count_tokens: Callable[[str], int] | None,
) -> RunResult:
    offsets_s = arrival_offsets_s(len(requests), point, np.random.default_rng((seed, 1)))
    records = [RequestRecord(i, request.num_output_tokens) for i, request in enumerate(requests)]
    watcher = MetricsWatcher(client, options.metrics_url, options.poll_interval_s) if options.metrics_url else None
    if watcher is not None:
        await watcher.start()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    with tqdm(total=len(requests), desc=point.label, disable=not options.show_progress, leave=False) as progress:
        duration_s = await _send_all(client, cfg, requests, records, offsets_s, point, progress, count_tokens)
    server_metrics = await watcher.stop() if watcher is not None else None
    metrics = compute_metrics(records, duration_s, options.metrics)
    return RunResult(point, seed, started_at, metrics, server_metrics, records)


async def _send_all(
    client: aiohttp.ClientSession,
    cfg: EndpointConfig,
    requests: list[BenchRequest],
    records: list[RequestRecord],
    offsets_s: np.ndarray,
    point: LoadPoint,
    progress: tqdm,
    count_tokens: Callable[[str], int] | None,
) -> float:
    """Returns the run's duration: first send to last completion."""
    limit = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else contextlib.nullcontext()
    start_s = time.perf_counter()

    async def send(i: int) -> None:
        await asyncio.sleep(max(0.0, start_s + offsets_s[i] - time.perf_counter()))
        async with limit:  # a request delayed by the cap is timed from when it is actually sent
            records[i].send_offset_s = time.perf_counter() - start_s
            await send_request(client, cfg, requests[i], records[i], count_tokens)
        progress.update(1)

    await asyncio.gather(*(send(i) for i in range(len(requests))))
    return time.perf_counter() - start_s


async def run_warmups(
    client: aiohttp.ClientSession, cfg: EndpointConfig, requests: list[BenchRequest], max_concurrency: int | None
) -> list[RequestRecord]:
    """Unmeasured requests, all sent at once under the cap, that warm connections, kernels and caches."""
    records = [RequestRecord(i, request.num_output_tokens) for i, request in enumerate(requests)]
    point = LoadPoint(max_concurrency=max_concurrency)
    with tqdm(total=len(requests), disable=True) as progress:
        await _send_all(client, cfg, requests, records, np.zeros(len(requests)), point, progress, None)
    return records
