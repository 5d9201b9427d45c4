"""Speculative decoding under structured outputs (the real scheduler and worker, in process, fp32): JSON-schema
requests draft, the worker masks each verification row with the grammar state after the drafts before it and rolls
the matcher back past rejected drafts, so greedy outputs equal the plain serial loop's, parse, and fit the schema;
copying prompts accept drafts."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind
from tests.unit.pagedserve.engine_runs import Run, chat_requests, exact_worker, run

ALWAYS_ON = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                        "prompt_lookup_max": 3, "disable_by_batch_size": 0})
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                         "population": {"type": "integer"},
                                         "coastal": {"type": "boolean"},
                                         "landmarks": {"type": "array", "items": {"type": "string", "maxLength": 20},
                                                       "maxItems": 3}},
        "required": ["city", "population", "coastal", "landmarks"], "additionalProperties": False}
SCHEMA = StructuredOutput(StructuredOutputKind.JSON_SCHEMA, json.dumps(CITY))
RECORDS = [{"city": "Paris", "population": 2102650, "coastal": False, "landmarks": ["Eiffel Tower", "Louvre"]},
           {"city": "Lima", "population": 10719000, "coastal": True, "landmarks": ["Plaza Mayor"]},
           {"city": "Oslo", "population": 709037, "coastal": True, "landmarks": ["Opera House", "Vigeland Park"]}]
pytestmark = pytest.mark.slow  # three runs of 5 constrained requests: about 3 min on a loaded 2-core machine
QUESTIONS = ["Describe Rome as JSON, please.", "Describe Seoul as JSON, please."]


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    return exact_worker(smollm2_dir)


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Three copying prompts (the answer repeats the prompt's JSON: drafts are accepted) and two open ones (drafts
    are mostly rejected, some refused by the grammar), all greedy and all under the schema: every accepted draft
    went through a grammar mask."""
    contents = [f"Repeat this JSON exactly, nothing else: {json.dumps(record)}" for record in RECORDS]
    return chat_requests(smollm2_dir, contents + QUESTIONS, lambda i, _: SamplingParams(
        temperature=0.0, max_tokens=70, structured_output=SCHEMA))


@pytest.fixture(scope="module")
def plain(worker, requests) -> Run:
    return run(worker, requests, async_scheduling=False)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_schema_requests_draft_and_give_the_plain_outputs(worker, requests, plain, smollm2_dir, async_scheduling):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    for request in requests:
        assert plain.reasons[request.req_id] is FinishReason.STOP, request.req_id
        text = tokenizer.decode(plain.tokens[request.req_id], skip_special_tokens=True)
        assert set(json.loads(text)) == set(CITY["properties"]), text  # the grammar did constrain
    spec = run(worker, requests, async_scheduling, speculative_config=ALWAYS_ON)
    for request in requests:
        req_id = request.req_id
        assert (spec.tokens[req_id], spec.reasons[req_id]) == (plain.tokens[req_id], plain.reasons[req_id]), req_id
    counters = spec.scheduler.drafts.counters
    assert counters.num_accepted_tokens > 20 and counters.num_draft_tokens > counters.num_accepted_tokens

