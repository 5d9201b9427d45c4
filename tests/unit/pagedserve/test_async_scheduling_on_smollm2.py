"""Async scheduling on the real model: the same greedy outputs as the serial loop, stops and aborts exact, and
preemption in a tiny pool, through the real scheduler and worker (in process, one step in flight)."""

from __future__ import annotations

import pytest

from pagedserve.benchmarks.engine.workloads import TOPICS
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from tests.unit.pagedserve.engine_runs import (
    Run,
    assert_same_outputs,
    chat_requests,
    exact_worker,
    mixed_stops,
    roomy_run,
    run,
)

NUM_REQUESTS = 24
ABORTS = {3: 6, 10: 9, 17: 14}  # request index -> engine step at which it is aborted
TINY_POOL = 12  # blocks of 16 tokens, a fraction of what the 24 requests would hold at once: requests preempt


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    return exact_worker(smollm2_dir)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Prompts of about 30 to 110 tokens, answers of 6 to 31; a third stop on a token id (',' or '.'), a quarter
    ignore EOS."""
    def content(i: int) -> str:
        topic = TOPICS[i % len(TOPICS)]
        notes = " ".join(f"Note {k}: {topic} comes up in chapter {k}." for k in range(i % 7))
        return f"{notes} What is {topic}?"

    return chat_requests(smollm2_dir, [content(i) for i in range(NUM_REQUESTS)],
                         lambda i, stops: mixed_stops(i, 6 + (i * 7) % 26, stops))


@pytest.fixture(scope="module")
def serial(worker, requests) -> Run:
    return roomy_run(worker, requests)


def test_async_gives_the_serial_loops_greedy_outputs_with_aborts_and_preemptions(worker, requests, serial):
    """The reference runs serially in a pool that holds everything; the async run preempts in a tiny one and aborts
    three requests mid-stream: every other request gets the reference's tokens and finish reason exactly, and an
    aborted one a prefix of its reference."""
    assert FinishReason.STOP in serial.reasons.values() and FinishReason.LENGTH in serial.reasons.values()
    tiny = run(worker, requests, async_scheduling=True, num_blocks=TINY_POOL, aborts=ABORTS)
    assert tiny.num_preemptions > 0
    assert_same_outputs(tiny, serial, requests, ABORTS)
