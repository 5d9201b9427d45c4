"""Where one stream's per-token time goes: a single streamed completion against a running pagedserve, read three ways.

- the client: inter-token latency (ITL) of the SSE chunks it receives;
- the scheduler's counters (its own /metrics): engine steps, the worker's time in steps (forward pass, of which
  sampling) and the worker's wait between back-to-back steps (the scheduler <-> worker round trip and the
  scheduler's own work between steps, which async scheduling hides);
- CPU seconds of each process (/proc): on a machine with few cores the gateway's, scheduler's and client's CPU per
  token is taken from the forward pass even when it overlaps it.

A single stream decodes one token a step, so per step = per token; ITL p50 should equal the worker's cycle (step +
wait) and the difference is what delivery adds to the critical path.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import aiohttp

from pagedserve.benchmarks.latency import process_cpu
from pagedserve.benchmarks.prometheus import parse_prometheus_text

COUNTERS = {"steps": "pagedserve_engine_steps_total", "step_s": "pagedserve_worker_step_seconds_total",
            "sample_s": "pagedserve_worker_sample_seconds_total", "idle_s": "pagedserve_worker_idle_seconds_total"}
PROMPT = "Write a long story about a lighthouse keeper who finds a map in a bottle. Begin:"


@dataclass
class StreamRun:
    """One streamed completion and what the server's counters and the processes' CPU did meanwhile."""

    itl_s: list[float]  # gaps between content chunks after the first
    ttft_s: float
    num_output_tokens: int
    counters: dict[str, float]  # increase of each COUNTERS entry
    cpu_s: dict[str, float]  # CPU seconds by process (worker, scheduler, gateway, client)


@dataclass
class Breakdown:
    """Per output token (medians over the runs), in milliseconds."""

    itl_p50_ms: float
    itl_mean_ms: float
    ttft_ms: float
    forward_ms: float  # worker step time less sampling: the forward pass, logits and the step's input building
    sampling_ms: float
    worker_wait_ms: float  # the worker's wait between steps: round trip to the scheduler and its step work
    steps_per_token: float
    cpu_ms: dict[str, float]  # by process

    @property
    def cycle_ms(self) -> float:
        return self.forward_ms + self.sampling_ms + self.worker_wait_ms

    def table(self) -> str:
        rows = [("ITL p50 (client)", self.itl_p50_ms), ("ITL mean (client)", self.itl_mean_ms),
                ("worker: forward pass", self.forward_ms), ("worker: sampling", self.sampling_ms),
                ("worker: waiting for the next step", self.worker_wait_ms),
                ("= worker cycle", self.cycle_ms)]
        rows += [(f"CPU: {name}", ms) for name, ms in self.cpu_ms.items()]
        lines = ["| per output token | ms |", "| --- | ---: |"]
        lines += [f"| {label} | {value:.2f} |" for label, value in rows]
        lines.append(f"| TTFT | {self.ttft_ms:.1f} |")
        lines.append(f"| engine steps per token | {self.steps_per_token:.2f} |")
        return "\n".join(lines)


async def scrape_counters(session: aiohttp.ClientSession, metrics_url: str) -> dict[str, float]:
    async with session.get(metrics_url) as response:
        samples = parse_prometheus_text(await response.text())
    missing = [name for name in COUNTERS.values() if name not in samples]
    if missing:
        raise RuntimeError(f"{metrics_url} lacks {missing}: not a pagedserve scheduler with step timings")
    return {key: sum(samples[name]) for key, name in COUNTERS.items()}


async def stream_completion(session: aiohttp.ClientSession, base_url: str, model: str, num_tokens: int
                            ) -> tuple[list[float], int]:
    """Arrival times (perf_counter, from the request) of the chunks that carry text, and the output tokens."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": num_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start_s, arrivals, num_output = time.perf_counter(), [], 0
    async with session.post(base_url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                arrivals.append(time.perf_counter() - start_s)
            if chunk.get("usage"):
                num_output = chunk["usage"]["completion_tokens"]
    return arrivals, num_output


async def measure(base_url: str, metrics_url: str, model: str, num_tokens: int, pids: dict[str, int]) -> StreamRun:
    """One stream through the gateway at `base_url`; counters from the scheduler's `metrics_url`."""
    async with aiohttp.ClientSession(trust_env=False) as session:
        before_counters, before_cpu = await scrape_counters(session, metrics_url), process_cpu.snapshot(pids)
        arrivals, num_output = await stream_completion(session, base_url, model, num_tokens)
        after_cpu, after_counters = process_cpu.snapshot(pids), await scrape_counters(session, metrics_url)
    return StreamRun(itl_s=[b - a for a, b in zip(arrivals[:-1], arrivals[1:], strict=True)], ttft_s=arrivals[0],
                     num_output_tokens=num_output,
                     counters={k: after_counters[k] - before_counters[k] for k in COUNTERS},
                     cpu_s={k: after_cpu[k] - before_cpu[k] for k in after_cpu})


def summarize(runs: list[StreamRun]) -> Breakdown:
    def med(values) -> float:
        return statistics.median(values)

    def per_step_ms(key: str) -> float:
        return med(run.counters[key] / run.counters["steps"] * 1e3 for run in runs)

    sample_ms = per_step_ms("sample_s")
    return Breakdown(
        itl_p50_ms=med(med(run.itl_s) for run in runs) * 1e3,
        itl_mean_ms=med(statistics.fmean(run.itl_s) for run in runs) * 1e3,
        ttft_ms=med(run.ttft_s for run in runs) * 1e3,
        forward_ms=per_step_ms("step_s") - sample_ms, sampling_ms=sample_ms, worker_wait_ms=per_step_ms("idle_s"),
        steps_per_token=med(run.counters["steps"] / run.num_output_tokens for run in runs),
        cpu_ms={name: med(run.cpu_s[name] / run.num_output_tokens * 1e3 for run in runs) for name in runs[0].cpu_s})


def to_json(breakdown: Breakdown, runs: list[StreamRun], extra: dict) -> str:
    return json.dumps({"breakdown": asdict(breakdown), "cycle_ms": breakdown.cycle_ms,
                       "runs": [asdict(run) for run in runs], **extra}, indent=1)
