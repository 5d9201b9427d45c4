"""Speculative decoding with a draft model on the real target (the scheduler and the worker in process, fp32):
greedy outputs identical to the plain serial loop's with async scheduling, stop tokens, max_tokens, a JSON-schema
request, aborts mid-stream and preemption in a tiny pool, every block free after (seeded sampling:
test_speculative_draft_exactness_on_smollm2.py). Two drafts: the target itself (its drafts are the target's greedy
tokens: nearly all accepted) and a tiny random-weight Llama of the same vocabulary (nearly all rejected)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pagedserve.benchmarks.engine.workloads import TOPICS
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.pagedserve.draft_models import draft_model_config, tiny_llama
from tests.unit.pagedserve.engine_runs import Run, assert_same_outputs, chat_requests, exact_worker, mixed_stops, run

# a plain reference and five speculative runs of the real model: several minutes on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
NUM_REQUESTS = 24
ABORTS = {3: 6, 10: 9, 17: 14}  # request index -> engine step at which it is aborted
TINY_POOL = 12  # blocks of 16 tokens, no prefix caching: the requests preempt each other
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "coastal": {"type": "boolean"}},
        "required": ["city", "coastal"], "additionalProperties": False}
SCHEMA_INDEX = NUM_REQUESTS  # the last request answers under a JSON schema


@pytest.fixture(scope="module")
def self_draft(smollm2_dir) -> str:
    return draft_model_config(smollm2_dir)


@pytest.fixture(scope="module")
def tiny_draft(smollm2_dir, tmp_path_factory) -> str:
    return draft_model_config(tiny_llama(tmp_path_factory.mktemp("tiny_llama"),
                                         load_model_config(smollm2_dir).vocab_size))


@pytest.fixture(scope="module")
def worker(smollm2_dir, self_draft) -> Worker:
    """The target with itself as its draft model; with speculation off in the scheduler it runs plain steps."""
    return exact_worker(smollm2_dir, self_draft)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Half copy a list from the prompt, half are open questions; a third stop on ',' or '.', a quarter ignore EOS;
    answers of 6 to 40 tokens; then one greedy request under a JSON schema that copies a JSON from its prompt."""
    def content(i: int) -> str:
        topic = TOPICS[i % len(TOPICS)]
        if i % 2 == 0:
            return f"Repeat this list exactly, nothing else: {'; '.join(f'{topic} item {k}' for k in range(2 + i % 5))}"
        return f"What is {topic}?"

    contents = [content(i) for i in range(NUM_REQUESTS)]
    contents.append(f"Repeat this JSON exactly, nothing else: {json.dumps({'city': 'Lima', 'coastal': True})}")
    schema = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(CITY))
    return chat_requests(smollm2_dir, contents, lambda i, stops: mixed_stops(i, 6 + (i * 7) % 35, stops)
                         if i < NUM_REQUESTS else SamplingParams(temperature=0.0, max_tokens=40,
                                                                 structured_output=schema))


@pytest.fixture(scope="module")
def plain(worker, requests, smollm2_dir) -> Run:
    reference = run(worker, requests, async_scheduling=False)
    assert FinishReason.STOP in reference.reasons.values() and FinishReason.LENGTH in reference.reasons.values()
    schema_request = requests[SCHEMA_INDEX].req_id
    assert reference.reasons[schema_request] is FinishReason.STOP
    text = AutoTokenizer.from_pretrained(smollm2_dir).decode(reference.tokens[schema_request],
                                                             skip_special_tokens=True)
    assert set(json.loads(text)) == {"city", "coastal"}, text  # the grammar did constrain
    return reference


def test_the_target_as_its_own_draft_gives_the_plain_outputs_and_is_nearly_always_accepted(
        worker, requests, plain, self_draft):
    """Async scheduling, a tiny pool (preemption: the draft KV is recomputed with the mirror), aborts: every request
    gets the plain serial run's tokens; drafts are the target's own greedy tokens, so nearly all are accepted (a
    draft of a banned EOS under ignore_eos, or one past a stop, is not); `run` checked no block or mirror is left."""
    spec = run(worker, requests, True, num_blocks=TINY_POOL, aborts=ABORTS, speculative_config=self_draft,
               enable_prefix_caching=False)
    assert spec.num_preemptions > 0
    counters = spec.scheduler.drafts.counters
    assert counters.num_draft_tokens > 100
    assert counters.num_accepted_tokens >= 0.8 * counters.num_draft_tokens
    assert_same_outputs(spec, plain, requests, ABORTS)


def test_a_tiny_random_draft_is_rejected_and_changes_nothing(smollm2_dir, requests, plain, tiny_draft):
    """The same run with a random 2-layer Llama as the draft: its drafts are rejected and the outputs are still the
    plain ones (the target's numbers are those of the other worker: fp32, batch-independent)."""
    worker = exact_worker(smollm2_dir, tiny_draft)
    spec = run(worker, requests, True, num_blocks=TINY_POOL, aborts=ABORTS, speculative_config=tiny_draft,
               enable_prefix_caching=False)
    assert spec.num_preemptions > 0
    counters = spec.scheduler.drafts.counters
    assert counters.num_draft_tokens > 100 and counters.num_accepted_tokens < 0.2 * counters.num_draft_tokens
    assert_same_outputs(spec, plain, requests, ABORTS)
