"""Overload run: short requests arriving at a multiple of the server's measured capacity for a fixed time.

Every request must end as a 200 or as a 429 with a Retry-After; none may hang or get a 5xx; the services' memory
must stay bounded; and the accepted requests' median time to first token is compared with the unloaded one.

    python -m pagedserve.benchmarks.overload --base-url http://127.0.0.1:8000 --duration-s 60 --multiple 4 \
        --pid scheduler=1234 --pid gateway=1235 --out overload.json
    python -m pagedserve.benchmarks.overload --serve models/SmolLM2-135M-Instruct --serve-arg=--max-queue-wait-s=0.5
        (starts `pagedserve serve` on free ports, follows its services' memory, stops it at the end)

With the scheduler's /metrics (`--metrics-url`, or the port `--serve` gives it) the report also splits the accepted
requests' time to first token over the load phase: the scheduler's means (arrival at the scheduler to first token,
of which queue and prompt compute) and its step time, against the client's mean.

Capacity: completed requests (whole 200 streams) per second of a closed loop at `--capacity-concurrency` streams.
Arrivals are evenly spaced (open loop: a request is sent on time whatever the server does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from pagedserve.benchmarks.prometheus import Samples, scrape
from pagedserve.services.ports import free_port

SHORT_PROMPTS = ["Name a color.", "What is two plus two?", "Say hello in French.", "Name a fruit.",
                 "What day comes after Monday?", "Name a planet.", "Give me a word that rhymes with cat.",
                 "What is the opposite of hot?"]


@dataclass
class Outcome:
    status: int  # HTTP status; 0 when the request got no answer in time (it hung) or the connection failed
    retry_after: str | None = None
    ttft_s: float | None = None  # first content token
    latency_s: float = 0.0
    error: str = ""  # an error event inside a 200, or the failure


@dataclass
class OverloadReport:
    capacity_rps: float
    offered_rps: float
    duration_s: float
    unloaded_ttft_p50_s: float
    num_requests: int = 0
    num_ok: int = 0
    num_429: int = 0
    num_429_with_retry_after: int = 0
    num_5xx: int = 0
    num_other: int = 0
    num_hung: int = 0  # no answer within the request timeout, or a connection error
    num_stream_errors: int = 0  # a 200 whose stream ended in an error event
    accepted_ttft_p50_s: float | None = None
    accepted_ttft_p99_s: float | None = None
    ttft_ratio: float | None = None  # accepted p50 / unloaded p50
    rss_mib: dict[str, dict[str, float]] = field(default_factory=dict)  # service -> before / peak / after
    cpu_cores: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds per second of the load phase
    accepted_ttft_mean_s: float | None = None
    scheduler_means_ms: dict[str, float] = field(default_factory=dict)  # over the load phase: see SCHEDULER_MEANS


# Histograms of the scheduler (means over the load phase), then its step counters.
SCHEDULER_MEANS = {"ttft": "pagedserve_time_to_first_token_seconds", "queue": "pagedserve_request_queue_time_seconds",
                   "prefill": "pagedserve_request_prefill_time_seconds"}
STEPS, STEP_SECONDS = "pagedserve_engine_steps_total", "pagedserve_worker_step_seconds_total"
STEP_TOKENS = "pagedserve_scheduled_tokens_total"


def body(index: int, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": SHORT_PROMPTS[index % len(SHORT_PROMPTS)]}],
            "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True}


async def one_request(session: aiohttp.ClientSession, base_url: str, payload: dict, timeout_s: float) -> Outcome:
    start_s = time.perf_counter()
    try:
        outcome = await asyncio.wait_for(_post(session, base_url, payload, start_s), timeout_s)
    except (TimeoutError, aiohttp.ClientError) as exc:
        outcome = Outcome(0, error=f"{type(exc).__name__}: {exc}")
    outcome.latency_s = time.perf_counter() - start_s
    return outcome


async def _post(session: aiohttp.ClientSession, base_url: str, payload: dict, start_s: float) -> Outcome:
    async with session.post(f"{base_url}/v1/chat/completions", json=payload) as response:
        outcome = Outcome(response.status, response.headers.get("Retry-After"))
        if response.status != 200:
            await response.read()
        else:
            await _read_stream(response, outcome, start_s)
    return outcome


async def _read_stream(response: aiohttp.ClientResponse, outcome: Outcome, start_s: float) -> None:
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[len("data: "):])
        if "error" in event:
            outcome.error = event["error"].get("message", "error")
        elif outcome.ttft_s is None and any(c["delta"].get("content") for c in event.get("choices", [])):
            outcome.ttft_s = time.perf_counter() - start_s


async def measure_capacity(session: aiohttp.ClientSession, base_url: str, concurrency: int, num_requests: int,
                           max_tokens: int) -> float:
    """Completed requests per second of a closed loop: whole 200 streams only (a quick 429 is no capacity)."""
    counter = iter(range(num_requests))
    outcomes: list[Outcome] = []

    async def worker() -> None:
        for index in counter:
            outcomes.append(await one_request(session, base_url, body(index, max_tokens), 120))

    start_s = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    completed = sum(o.status == 200 and not o.error for o in outcomes)
    if not completed:
        raise RuntimeError(f"no request of the capacity run completed: {outcomes[:5]}")
    return completed / (time.perf_counter() - start_s)


async def unloaded_ttft_p50(session: aiohttp.ClientSession, base_url: str, num: int, max_tokens: int,
                            num_warmups: int = 2) -> float:
    """p50 TTFT of `num` requests one at a time, after `num_warmups` untimed ones (a fresh server's first requests
    are slower, which would flatter the loaded/unloaded ratio); raises with their outcomes when none streamed."""
    for index in range(num_warmups):
        await one_request(session, base_url, body(index, max_tokens), 60)
    outcomes = [await one_request(session, base_url, body(index, max_tokens), 60) for index in range(num)]
    ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    if not ttfts:
        raise RuntimeError(f"no unloaded request streamed a token: {outcomes}")
    return statistics.median(ttfts)


def scheduler_means_ms(before: Samples | None, after: Samples | None) -> dict[str, float]:
    """Mean of each SCHEDULER_MEANS histogram over the scrapes' interval (ms), the worker's mean step (ms) and the
    tokens a step computed; what the interval lacks (or a scrape that got nothing) is left out."""
    before, after = before or {}, after or {}

    def delta(name: str) -> float:
        return sum(after.get(name, [])) - sum(before.get(name, []))

    means = {key: 1000 * delta(name + "_sum") / delta(name + "_count")
             for key, name in SCHEDULER_MEANS.items() if delta(name + "_count")}
    if steps := delta(STEPS):
        means["worker_step"] = 1000 * delta(STEP_SECONDS) / steps
        means["tokens_per_step"] = delta(STEP_TOKENS) / steps
    return means


def cpu_s(pid: int | str) -> float:
    """User + system CPU seconds a process has used (Linux /proc; "self" for this one)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def offered_load(session: aiohttp.ClientSession, base_url: str, rate_rps: float, duration_s: float,
                       max_tokens: int, timeout_s: float, pids: dict[str, int]
                       ) -> tuple[list[Outcome], dict[str, float]]:
    """Send at `rate_rps` for `duration_s`; wait for every request. Returns the outcomes and peak RSS per pid."""
    peaks = {name: rss_mib(pid) for name, pid in pids.items()}
    tasks, start_s, index = [], time.perf_counter(), 0
    while (now_s := time.perf_counter() - start_s) < duration_s:
        due_s = index / rate_rps
        if due_s > now_s:
            await asyncio.sleep(due_s - now_s)
            continue
        tasks.append(asyncio.create_task(one_request(session, base_url, body(index, max_tokens), timeout_s)))
        index += 1
        if index % 20 == 0:
            peaks = {name: max(peaks[name], rss_mib(pid)) for name, pid in pids.items()}
    outcomes = await asyncio.gather(*tasks)
    return outcomes, {name: max(peaks[name], rss_mib(pid)) for name, pid in pids.items()}


def summarize(report: OverloadReport, outcomes: list[Outcome]) -> OverloadReport:
    report.num_requests = len(outcomes)
    for outcome in outcomes:
        if outcome.status == 200:
            report.num_ok += 1
            report.num_stream_errors += bool(outcome.error)
        elif outcome.status == 429:
            report.num_429 += 1
            report.num_429_with_retry_after += outcome.retry_after is not None and outcome.retry_after.isdigit()
        elif outcome.status >= 500:
            report.num_5xx += 1
        elif outcome.status == 0:
            report.num_hung += 1
        else:
            report.num_other += 1
    ttfts = sorted(o.ttft_s for o in outcomes if o.status == 200 and o.ttft_s is not None)
    if ttfts:
        report.accepted_ttft_mean_s = statistics.fmean(ttfts)
        report.accepted_ttft_p50_s = statistics.median(ttfts)
        report.accepted_ttft_p99_s = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
        report.ttft_ratio = report.accepted_ttft_p50_s / report.unloaded_ttft_p50_s
    return report


async def run(base_url: str, duration_s: float, multiple: float, max_tokens: int, capacity_concurrency: int,
              capacity_requests: int, timeout_s: float, pids: dict[str, int],
              cpu_pids: dict[str, int] | None = None, metrics_url: str | None = None) -> OverloadReport:
    """The unloaded TTFT, the capacity, then the offered load; RSS of `pids`, CPU of `cpu_pids` (default `pids`)
    and of this client, and the scheduler's means at `metrics_url`, over the load phase."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
        unloaded = await unloaded_ttft_p50(session, base_url, 16, max_tokens)
        capacity = await measure_capacity(session, base_url, capacity_concurrency, capacity_requests, max_tokens)
        before = {name: rss_mib(pid) for name, pid in pids.items()}
        cpu_pids = {**(cpu_pids or pids), "client": "self"}
        metrics_before = await scrape(session, metrics_url) if metrics_url else None
        cpu_before, start_s = {name: cpu_s(pid) for name, pid in cpu_pids.items()}, time.perf_counter()
        outcomes, peaks = await offered_load(session, base_url, capacity * multiple, duration_s, max_tokens,
                                             timeout_s, pids)
        wall_s = time.perf_counter() - start_s
        metrics_after = await scrape(session, metrics_url) if metrics_url else None
        cpu = {name: (cpu_s(pid) - cpu_before[name]) / wall_s for name, pid in cpu_pids.items()}
        after = {name: rss_mib(pid) for name, pid in pids.items()}
    report = OverloadReport(capacity, capacity * multiple, duration_s, unloaded)
    report.rss_mib = {name: {"before": before[name], "peak": peaks[name], "after": after[name]} for name in pids}
    report.cpu_cores = cpu
    report.scheduler_means_ms = scheduler_means_ms(metrics_before, metrics_after)
    return summarize(report, outcomes)


def _service_pids(launcher_pid: int) -> dict[str, int]:
    """The worker, scheduler and gateway processes `pagedserve serve` started (Linux /proc)."""
    pids = {}
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for pid in map(int, children):
        cmdline = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        for name, module in (("worker", "pagedserve.services.gpu_worker"),
                             ("scheduler", "pagedserve.services.scheduler"),
                             ("gateway", "pagedserve.services.gateway")):
            if module in cmdline:
                pids[name] = pid
    return pids


def _serve(model_dir: str, args: list[str]) -> tuple[subprocess.Popen, str, dict[str, int], str]:
    """`pagedserve serve` on free ports, once /health says 200: (process, base URL, service pids, the scheduler's
    metrics URL)."""
    port, metrics_port = free_port(), free_port()
    process = subprocess.Popen([sys.executable, "-m", "pagedserve.services.cli", "serve", model_dir, "--port",
                                str(port),
                                "--scheduler-port", str(free_port()), "--worker-port", str(free_port()),
                                "--metrics-port", str(metrics_port), *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base_url = f"http://127.0.0.1:{port}"
    deadline_s = time.monotonic() + 600
    while time.monotonic() < deadline_s and process.poll() is None:
        try:
            if urllib.request.urlopen(base_url + "/health", timeout=2).status == 200:
                return process, base_url, _service_pids(process.pid), f"http://127.0.0.1:{metrics_port}/metrics"
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError("pagedserve serve did not become healthy")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.overload",
                                     description=__doc__.splitlines()[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="a running server")
    target.add_argument("--serve", metavar="MODEL_DIR", help="start `pagedserve serve MODEL_DIR` for the run")
    parser.add_argument("--serve-arg", action="append", default=[], help="a flag for `serve` (repeatable)")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--multiple", type=float, default=4.0, help="offered load / measured capacity")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--capacity-concurrency", type=int, default=32)
    parser.add_argument("--capacity-requests", type=int, default=96)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="a request without an answer by then hung")
    parser.add_argument("--metrics-url", help="the scheduler's /metrics (with --base-url)")
    parser.add_argument("--pid", action="append", default=[], help="NAME=PID of a service whose RSS to follow")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    pids = {name: int(pid) for name, pid in (item.split("=", 1) for item in args.pid)}
    server, base_url, metrics_url = None, args.base_url, args.metrics_url
    cpu_pids = dict(pids)
    if args.serve:
        server, base_url, served, metrics_url = _serve(args.serve, args.serve_arg)
        pids = {**{k: v for k, v in served.items() if k != "worker"}, **pids}  # the worker's RSS is its model
        cpu_pids = {**served, **cpu_pids}
    try:
        report = asyncio.run(run(base_url.rstrip("/"), args.duration_s, args.multiple, args.max_tokens,
                                 args.capacity_concurrency, args.capacity_requests, args.timeout_s, pids, cpu_pids,
                                 metrics_url))
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(600)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    ok = (report.num_5xx == report.num_hung == report.num_other == report.num_stream_errors == 0
          and report.num_429 == report.num_429_with_retry_after)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
