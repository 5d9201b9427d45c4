"""A request resumed on another engine (issue 46) continues exactly as the unfailed run did, on SmolLM2 with
--batch-invariant: run greedy, seeded (temperature 0.8) and JSON-schema requests to their end, then submit each
again as a continuation (prompt + its first k outputs as `resumed_output_token_ids`, the same parameters) to a fresh
engine, batched together with other requests: each streams exactly the rest of its unfailed outputs and ends for the
same reason. The seeded draws depend on (seed, output index), so the worker must see the resumed ids as outputs; the
schema's matcher replays them; the stream never repeats them."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pagedserve.llm import chat_token_ids
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.pagedserve.engine_runs import Run, batch_invariant_worker, run

# about 3 min on a loaded 2-core machine: three runs of 5 requests in batch-invariant mode
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "population": {"type": "integer"},
                                         "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                       "maxItems": 2}},
        "required": ["city", "population", "landmarks"], "additionalProperties": False}
SCHEMA = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(CITY))
# req_id -> (question, sampling, resume point k)
CASES = {
    "greedy": ("Explain what a hash table is.", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), 17),
    "seeded": ("Write a short poem about rain.",
               SamplingParams(temperature=0.8, seed=1234, max_tokens=40, ignore_eos=True), 9),
    "seeded-early": ("Name three rivers.", SamplingParams(temperature=0.8, seed=7, max_tokens=40, ignore_eos=True), 1),
    "schema": ("Describe Lima as JSON, please.", SamplingParams(temperature=0.0, max_tokens=80,
                                                               structured_output=SCHEMA), 11),
    "schema-seeded": ("Describe Oslo as JSON, please.", SamplingParams(temperature=0.8, seed=99, max_tokens=80,
                                                                      structured_output=SCHEMA), 6),
}


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    return batch_invariant_worker(smollm2_dir)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return [GenerateRequest(req_id, chat_token_ids(tokenizer, [{"role": "user", "content": question}]), sampling)
            for req_id, (question, sampling, _) in CASES.items()]


@pytest.fixture(scope="module")
def unfailed(worker, requests) -> Run:
    return run(worker, requests, async_scheduling=False)


def continuation(request: GenerateRequest, outputs: list[int]) -> GenerateRequest:
    return GenerateRequest(request.req_id, list(request.prompt_token_ids), request.sampling,
                           resumed_output_token_ids=list(outputs))


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_a_resumed_request_continues_exactly_as_the_unfailed_run(worker, requests, unfailed, smollm2_dir,
                                                                 async_scheduling):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for request in requests:
        if request.sampling.structured_output is not None:  # the grammar did constrain, and the answer is whole
            assert unfailed.reasons[request.req_id] is FinishReason.STOP, request.req_id
            text = tokenizer.decode(unfailed.tokens[request.req_id], skip_special_tokens=True)
            assert set(json.loads(text)) == set(CITY["properties"]), text
        else:
            assert len(unfailed.tokens[request.req_id]) == request.sampling.max_tokens
    resumed = [continuation(r, unfailed.tokens[r.req_id][:CASES[r.req_id][2]]) for r in requests]
    # resumed on another engine, batched with the other continuations and in another order
    again = run(worker, resumed[::-1], async_scheduling)
    for request in requests:
        req_id, k = request.req_id, CASES[request.req_id][2]
        assert again.tokens[req_id] == unfailed.tokens[req_id][k:], req_id
        assert again.reasons[req_id] is unfailed.reasons[req_id], req_id
