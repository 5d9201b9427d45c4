"""Async scheduling on vs off through the real services: the same greedy outputs for 24 concurrent streams with
mixed lengths, stop strings, aborts mid-stream and preemptions in a tiny KV pool, and nothing left behind.

Exact numerics (fp32 weights, products and cache) make a request's tokens independent of its batch, so the two
stacks, which batch and preempt differently, must agree text for text."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from dataclasses import dataclass

import httpx
import pytest

from pagedserve.benchmarks.engine.workloads import TOPICS
from pagedserve.benchmarks.prometheus import parse_prometheus_text
from pagedserve.services.ports import free_port
from tests.integration.processes import MODEL_DIR, REPO, wait_for

NUM_DISTINCT = 21
# index of a prompt whose extra copy is abandoned -> after how many text chunks: prompts that ignore EOS and have no
# stop strings, so that their answers run to max_tokens (19, 15 and 23 tokens) and outlast the abandoning
ABORTED = {5: 3, 13: 5, 17: 8}
KV_BLOCKS = 8  # of 16 tokens: the longest request needs 6, all 24 at once about 50


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None  # None: abandoned by the client


def completions() -> list[dict]:
    """Prompts of about 10 to 60 tokens, answers of at most 4 to 23; a third stop on a string, a quarter ignore EOS."""
    bodies = []
    for i in range(NUM_DISTINCT):
        topic = TOPICS[i % len(TOPICS)]
        notes = " ".join(f"Note {k}: {topic} comes up in chapter {k}." for k in range(i % 5))
        body = {"prompt": f"{notes} Question: what is {topic}? Answer:", "max_tokens": 4 + (i * 7) % 20,
                "temperature": 0, "ignore_eos": i % 4 == 1}
        if i % 3 == 0:
            body["stop"] = [".", " and"]
        bodies.append(body)
    return bodies


async def stream(client: httpx.AsyncClient, model: str, body: dict, abandon_after: int | None) -> Answer:
    text, finish_reason, num_chunks = "", None, 0
    async with client.stream("POST", "/v1/completions", json={**body, "model": model, "stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choice = httpx.Response(200, content=line[6:]).json()["choices"][0]
            text += choice["text"]
            finish_reason = choice["finish_reason"] or finish_reason
            num_chunks += bool(choice["text"])
            if abandon_after is not None and num_chunks >= abandon_after:
                return Answer(text, None)  # leaving the block closes the connection mid-stream
    return Answer(text, finish_reason)


def kv_blocks_bytes() -> int:
    # fp32 cache of the default model: 2 (keys, values) x 30 layers x 3 KV heads x 64 x 4 bytes a token
    return KV_BLOCKS * 16 * 2 * 30 * 3 * 64 * 4


@contextlib.contextmanager
def serving(tmp_path, async_scheduling: bool):
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", str(MODEL_DIR), "--port", str(port),
            "--scheduler-port", str(free_port()), "--worker-port", str(free_port()), "--metrics-port",
            str(metrics_port), "--dtype", "float32", "--kv-cache-dtype", "float32", "--no-int8-activations",
            "--kv-cache-memory-bytes", str(kv_blocks_bytes()), "--max-model-len", "128",
            "--max-num-batched-tokens", "256", "--async-scheduling", str(async_scheduling).lower()]
    log_path = tmp_path / f"serve-async-{async_scheduling}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        def healthy() -> bool:
            assert process.poll() is None, log_path.read_text()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            return False

        wait_for(healthy, 300, interval_s=0.25, what="the stack's /health")
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def engine_figures(metrics_url: str) -> dict[str, float]:
    samples = parse_prometheus_text(httpx.get(metrics_url, timeout=10).text)
    return {name: sum(samples.get(f"pagedserve_{name}", [0.0]))
            for name in ("num_preemptions_total", "kv_cache_usage_perc", "num_requests_running",
                         "num_requests_waiting")}


def run_workload(tmp_path, async_scheduling: bool) -> tuple[list[Answer], dict[str, float]]:
    bodies = completions()
    jobs = [(body, None) for body in bodies] + [(bodies[i], after) for i, after in ABORTED.items()]
    with serving(tmp_path, async_scheduling) as (base_url, metrics_url):
        model = httpx.get(base_url + "/v1/models").json()["data"][0]["id"]

        async def all_streams() -> list[Answer]:
            async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
                return await asyncio.gather(*(stream(client, model, body, after) for body, after in jobs))

        answers = asyncio.run(all_streams())
        # every request ends (abandoned ones are aborted) and gives back its blocks
        def idle() -> dict[str, float] | None:
            figures = engine_figures(metrics_url)
            busy = figures["kv_cache_usage_perc"] or figures["num_requests_running"] or figures["num_requests_waiting"]
            return None if busy else figures

        figures = wait_for(idle, 30, what="an idle engine with every KV block free")
    return answers, figures


def run_with_preemptions(tmp_path, async_scheduling: bool, attempts: int = 3) -> tuple[list[Answer], dict]:
    """The workload until a run preempts: whether the tiny pool runs out depends on how the arrivals fall into
    steps (in about 1 of 5 fresh-clone runs one of the two stacks finished without a preemption)."""
    for _ in range(attempts):
        answers, figures = run_workload(tmp_path, async_scheduling)
        if figures["num_preemptions_total"] > 0:
            break
    return answers, figures


@pytest.mark.timeout(1800)
def test_async_scheduling_gives_the_serial_loops_outputs(tmp_path):
    serial, serial_figures = run_with_preemptions(tmp_path, async_scheduling=False)
    overlapped, overlapped_figures = run_with_preemptions(tmp_path, async_scheduling=True)
    assert serial_figures["num_preemptions_total"] > 0 and overlapped_figures["num_preemptions_total"] > 0
    assert overlapped[:NUM_DISTINCT] == serial[:NUM_DISTINCT]
    reasons = {answer.finish_reason for answer in serial[:NUM_DISTINCT]}
    assert reasons == {"stop", "length"}  # stop strings (and EOS) as well as max_tokens ended some
    for copy, index in enumerate(ABORTED):  # an abandoned stream got a prefix of the whole answer
        for answers in (serial, overlapped):
            partial = answers[NUM_DISTINCT + copy]
            assert partial.finish_reason is None and answers[index].text.startswith(partial.text)
