"""Seeded sampling with a draft model (the real scheduler and worker in process, fp32, the target as its own draft):
a request's tokens are the same run to run, whatever the batch and order, and the same as without speculation."""

from __future__ import annotations

import pytest

from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.pagedserve.draft_models import draft_model_config
from tests.unit.pagedserve.engine_runs import assert_seeded_speculation_exact, chat_requests, exact_worker

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def self_draft(smollm2_dir) -> str:
    return draft_model_config(smollm2_dir)


@pytest.fixture(scope="module")
def worker(smollm2_dir, self_draft) -> Worker:
    return exact_worker(smollm2_dir, self_draft)


def test_seeded_sampling_with_a_draft_model_is_reproducible_and_equals_the_plain_draws(worker, smollm2_dir,
                                                                                       self_draft):
    """temperature 0.5: rejection sampling against the greedy draft (q a point mass) keeps each draw the one the
    plain step makes for (seed, output index), whatever the batch and the order of arrival."""
    contents = [f"Repeat this list exactly, nothing else: {'; '.join(f'{topic} item {k}' for k in range(4))}"
                if i % 2 == 0 else f"Tell me a short story about {topic}."
                for i, topic in enumerate(["rivers", "planets", "metals", "birds"])]
    requests = chat_requests(smollm2_dir, contents, lambda i, _: SamplingParams(
        temperature=0.5, top_p=0.9, seed=100 + i, max_tokens=40))
    assert_seeded_speculation_exact(worker, requests, self_draft, min_accepted=20)
