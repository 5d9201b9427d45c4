"""Constrained requests preempted in a tiny KV pool give the outputs they give without preemption: the worker
rebuilds a preempted request's matcher by replaying its outputs (the real scheduler and worker, in process)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.pagedserve.engine_runs import Run, chat_requests, exact_worker, roomy_run, run

NUM_REQUESTS = 16
TINY_POOL = 10  # blocks of 16 tokens: a fraction of what the 16 requests hold at once, so requests preempt
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "population": {"type": "integer"},
                                         "coastal": {"type": "boolean"},
                                         "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                       "maxItems": 3}},
        "required": ["city", "population", "coastal", "landmarks"], "additionalProperties": False}
GRAMMARS = [StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(CITY)),
            StructuredOutput(StructuredOutputKind.JSON_OBJECT, ""),
            StructuredOutput(StructuredOutputKind.REGEX, r"[A-Z][a-z]+( [a-z]+){3,9}\.")]
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Hanoi", "Quito", "Rome", "Seoul"]


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    return exact_worker(smollm2_dir)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Each grammar kind in turn; every other request sampled with a seed (its draws depend only on the seed and
    its output index, so preemption must not change them either)."""
    contents = [f"Describe {CITIES[i % len(CITIES)]} as JSON, please." for i in range(NUM_REQUESTS)]
    return chat_requests(smollm2_dir, contents, lambda i, _: SamplingParams(
        temperature=0.0 if i % 2 == 0 else 0.8, seed=None if i % 2 == 0 else i, max_tokens=70,
        structured_output=GRAMMARS[i % len(GRAMMARS)]))


@pytest.fixture(scope="module")
def reference(worker, requests) -> Run:
    return roomy_run(worker, requests)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_preempted_constrained_requests_give_the_same_outputs(worker, requests, reference, smollm2_dir,
                                                              async_scheduling):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    schema_outputs = [tokenizer.decode(reference.tokens[r.req_id], skip_special_tokens=True) for r in requests
                      if r.sampling.structured_output is GRAMMARS[0] and reference.reasons[r.req_id] is
                      FinishReason.STOP]
    assert schema_outputs, "no schema-constrained request finished: the comparison would show little"
    for text in schema_outputs:
        assert set(json.loads(text)) == set(CITY["properties"]), text  # the grammar did constrain
    tiny = run(worker, requests, async_scheduling, num_blocks=TINY_POOL)
    assert tiny.num_preemptions >= NUM_REQUESTS // 2
    for request in requests:
        req_id = request.req_id
        assert (tiny.tokens[req_id], tiny.reasons[req_id]) == (reference.tokens[req_id], reference.reasons[req_id]), \
            req_id
