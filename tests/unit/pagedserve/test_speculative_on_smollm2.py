"""Speculative decoding (n-gram drafts) on the real model: greedy outputs identical to the plain serial loop, with
async scheduling, stop tokens, max_tokens, aborts mid-stream and preemption in a tiny pool; every block free after."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from benchmarks.engine.workloads import TOPICS
from pagedserve.llm import chat_token_ids
from services.gpu_worker.worker import Worker
from shared.request_io import FinishReason, GenerateRequest
from shared.sampling_params import SamplingParams
from tests.unit.pagedserve.engine_runs import Run, exact_worker, run

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
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    stops = tuple(tokenizer.convert_tokens_to_ids(t) for t in (",", "."))
    out = []
    for i in range(NUM_REQUESTS):
        topic = TOPICS[i % len(TOPICS)]
        if i % 2 == 0:
            items = "; ".join(f"{topic} item {k}" for k in range(2 + i % 5))
            content = f"Repeat this list exactly, nothing else: {items}"
        else:
            content = f"What is {topic}?"
        prompt = chat_token_ids(tokenizer, [{"role": "user", "content": content}])
        sampling = SamplingParams(temperature=0.0, max_tokens=6 + (i * 7) % 35,
                                  stop_token_ids=stops if i % 3 == 0 else (), ignore_eos=i % 4 == 1)
        out.append(GenerateRequest(f"r{i}", prompt, sampling))
    return out


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
    for index, request in enumerate(requests):
        req_id = request.req_id
        if index in ABORTS:
            assert spec.reasons[req_id] is FinishReason.ABORT
            assert spec.tokens[req_id] == plain.tokens[req_id][:len(spec.tokens[req_id])]
        else:
            assert (spec.tokens[req_id], spec.reasons[req_id]) == (plain.tokens[req_id], plain.reasons[req_id]), req_id
            assert len(spec.tokens[req_id]) <= request.sampling.max_tokens
