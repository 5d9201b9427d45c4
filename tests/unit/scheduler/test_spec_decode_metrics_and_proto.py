"""Speculative decoding's counters on /metrics, and its fields across the worker contract."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pagedserve.services.proto_convert.worker_contract import (
    step_input_from_pb,
    step_input_to_pb,
    step_output_from_pb,
    step_output_to_pb,
)
from pagedserve.services.scheduler.spec_decode.counters import SpecDecodeCounters
from pagedserve.services.scheduler.spec_decode.metrics import SpecDecodeCollector
from pagedserve.shared.step_protocol import StepInput, StepOutput


def test_counters_count_acceptance_per_draft_position():
    counters = SpecDecodeCounters()
    counters.record(4, 2)
    counters.record(3, 3)
    counters.record(2, 0)
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_tokens) == (3, 9, 5)
    assert counters.num_accepted_per_position == [2, 2, 1, 0]


def test_metrics_expose_vllms_names_with_a_position_label():
    counters = SpecDecodeCounters()
    counters.record(3, 2)
    registry = CollectorRegistry()
    registry.register(SpecDecodeCollector(lambda: (counters, "m")))
    text = generate_latest(registry).decode()
    assert 'pagedserve_spec_decode_num_drafts_total{model_name="m"} 1.0' in text
    assert 'pagedserve_spec_decode_num_draft_tokens_total{model_name="m"} 3.0' in text
    assert 'pagedserve_spec_decode_num_accepted_tokens_total{model_name="m"} 2.0' in text
    assert 'pagedserve_spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 1.0' in text
    assert 'position="2"} 0.0' in text


def test_drafts_and_acceptance_cross_the_worker_contract():
    step = StepInput(num_scheduled_tokens={"a": 4, "b": 1, "c": 3}, draft_token_ids={"a": [5, 6, 7]},
                     draft_model_slots={"c": 2})
    back_step = step_input_from_pb(step_input_to_pb(step))
    assert (back_step.draft_token_ids, back_step.draft_model_slots) == ({"a": [5, 6, 7]}, {"c": 2})
    output = StepOutput(req_ids=["a", "a", "b"], sampled_token_ids=[5, 9, 3], logprobs=[None] * 3,
                        num_accepted_drafts={"a": 1})
    back = step_output_from_pb(step_output_to_pb(output))
    assert (back.req_ids, back.sampled_token_ids, back.num_accepted_drafts) == (["a", "a", "b"], [5, 9, 3], {"a": 1})
