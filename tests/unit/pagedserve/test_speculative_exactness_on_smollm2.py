"""Speculative decoding is exact beyond greedy tokens (the real scheduler and worker, in process):
- seeded sampling (temperature > 0): a request's draw for output i depends only on (seed, i), and a draft is
  accepted when it equals that draw, so with speculation on the tokens are the same run to run whatever the batch
  composition and arrival order, and the same as without speculation;
- in `--batch-invariant` mode (the serving dtype), greedy requests get bit-identical logprobs and top logprobs with
  speculation on and off: a verification row's numbers do not depend on how many positions its chunk has."""

from __future__ import annotations

import json

import pytest

from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.pagedserve.engine_runs import (
    assert_seeded_speculation_exact,
    batch_invariant_worker,
    chat_requests,
    differing_requests,
    exact_worker,
    run,
)

pytestmark = pytest.mark.timeout(1800)
ALWAYS_ON = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                        "prompt_lookup_max": 3, "disable_by_batch_size": 0})
TOPICS = ["rivers", "planets", "metals", "birds", "colours", "tools"]


def _contents() -> list[str]:
    """Copying prompts (drafts are accepted) and open questions (drafts are rejected), alternately."""
    return [f"Repeat this list exactly, nothing else: {'; '.join(f'{topic} item {k}' for k in range(4))}"
            if i % 2 == 0 else f"Tell me a short story about {topic}." for i, topic in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def exact(smollm2_dir) -> Worker:
    return exact_worker(smollm2_dir)


def test_seeded_sampling_is_reproducible_and_equals_the_plain_draws(exact, smollm2_dir):
    requests = chat_requests(smollm2_dir, _contents(), lambda i, _: SamplingParams(
        temperature=0.5, top_p=0.9, seed=100 + i, max_tokens=48))
    assert_seeded_speculation_exact(exact, requests, ALWAYS_ON, min_accepted=10)


def test_batch_invariant_logprobs_are_identical_with_speculation(smollm2_dir):
    worker = batch_invariant_worker(smollm2_dir)
    requests = chat_requests(smollm2_dir, _contents(), lambda i, _: SamplingParams(
        temperature=0.0, max_tokens=40, logprobs=5))
    plain = run(worker, requests, async_scheduling=False)
    spec = run(worker, requests, async_scheduling=True, speculative_config=ALWAYS_ON)
    assert spec.scheduler.drafts.counters.num_accepted_tokens > 10
    assert differing_requests(spec, plain, requests) == []
    for request in requests:
        got, want = spec.logprobs[request.req_id], plain.logprobs[request.req_id]
        assert all(lp is not None for lp in want) and len(want) == len(plain.tokens[request.req_id])
        assert got == want, request.req_id  # float equality: bit-identical logprobs and top-5
