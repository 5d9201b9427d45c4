"""Speculative decoding (n-gram drafts) on the real model: greedy outputs identical to the plain serial loop, with
async scheduling, stop tokens, max_tokens, aborts mid-stream and preemption in a tiny pool; every block free after."""

from __future__ import annotations

import json

import pytest

from pagedserve.benchmarks.engine.workloads import TOPICS
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from tests.unit.pagedserve.engine_runs import Run, assert_same_outputs, chat_requests, exact_worker, mixed_stops, run

NUM_REQUESTS = 24
ABORTS = {3: 6, 10: 9, 17: 14}  # request index -> engine step at which it is aborted
TINY_POOL = 12  # blocks of 16 tokens: the 24 requests preempt each other
ALWAYS_ON = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                        "prompt_lookup_max": 3, "disable_by_batch_size": 0})


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    return exact_worker(smollm2_dir)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Half ask to repeat a list from the prompt (drafts are accepted), half are open questions; a third stop on
    ',' or '.', a quarter ignore EOS; answers of 6 to 40 tokens."""
    def content(i: int) -> str:
        topic = TOPICS[i % len(TOPICS)]
        if i % 2 == 0:
            items = "; ".join(f"{topic} item {k}" for k in range(2 + i % 5))
            return f"Repeat this list exactly, nothing else: {items}"
        return f"What is {topic}?"

    return chat_requests(smollm2_dir, [content(i) for i in range(NUM_REQUESTS)],
                         lambda i, stops: mixed_stops(i, 6 + (i * 7) % 35, stops))


@pytest.fixture(scope="module")
def plain(worker, requests) -> Run:
    return run(worker, requests, async_scheduling=False)


def test_speculation_gives_the_plain_greedy_outputs(worker, requests, plain):
    """Speculation always on with async scheduling, in a tiny pool with aborts: every request gets the plain serial
    run's tokens and finish reason (an aborted one a prefix), drafts were accepted (several tokens a step), and
    `run` checked that no block or mirror was left."""
    assert FinishReason.STOP in plain.reasons.values() and FinishReason.LENGTH in plain.reasons.values()
    spec = run(worker, requests, True, num_blocks=TINY_POOL, aborts=ABORTS, speculative_config=ALWAYS_ON)
    assert spec.num_preemptions > 0
    counters = spec.scheduler.drafts.counters
    assert counters.num_accepted_tokens > 20 and counters.num_draft_tokens > counters.num_accepted_tokens
    per_position = counters.num_accepted_per_position
    assert sum(per_position) == counters.num_accepted_tokens and per_position == sorted(per_position, reverse=True)
    assert_same_outputs(spec, plain, requests, ABORTS)
