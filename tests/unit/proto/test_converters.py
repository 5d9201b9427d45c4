"""Proto <-> domain converters: every field survives a round trip, order and absence included."""

from __future__ import annotations

import pytest

from pagedserve.services.proto_convert.common import (
    description_from_pb,
    description_to_pb,
    sampling_from_pb,
    sampling_to_pb,
)
from pagedserve.services.proto_convert.scheduler_contract import (
    generate_request_from_pb,
    generate_request_to_pb,
    integrity_from_pb,
    integrity_to_pb,
    output_from_chunk,
    output_to_chunk,
    stats_from_pb,
    stats_to_pb,
)
from pagedserve.services.proto_convert.worker_contract import (
    step_input_from_pb,
    step_input_to_pb,
    step_output_from_pb,
    step_output_to_pb,
    traceparents_from_pb,
)
from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, worker_pb2
from pagedserve.shared.integrity_report import IntegrityReport
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput
from pagedserve.shared.sampling_params import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    UINT32_MAX,
    SamplingParams,
    SamplingParamsError,
)
from pagedserve.shared.scheduler_stats import DICT_FIELDS, STATS_FIELDS, SchedulerStats
from pagedserve.shared.step_protocol import (
    CachedRequest,
    FailedRequest,
    ModelDescription,
    NewRequest,
    StepInput,
    StepOutput,
    TokenLogprobs,
)
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

PARAMS = SamplingParams(max_tokens=7, min_tokens=2, temperature=0.7, top_p=0.9, top_k=5, min_p=0.05, seed=-3,
                        presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1,
                        logit_bias={3: -100.0, 9: 2.5}, logprobs=0, stop_token_ids=(4, 5), ignore_eos=True)
LOGPROBS = TokenLogprobs(token_id=3, logprob=-0.25, rank=2, top_token_ids=[9, 3], top_logprobs=[-0.125, -0.25])


def test_sampling_params_round_trip_and_unset_fields_are_defaults():
    assert sampling_from_pb(sampling_to_pb(PARAMS)) == PARAMS
    assert sampling_from_pb(sampling_to_pb(SamplingParams())) == SamplingParams()
    assert sampling_from_pb(common_pb2.SamplingParams()) == SamplingParams()  # no surprising zeros
    assert sampling_from_pb(common_pb2.SamplingParams(temperature=0.0)).temperature == 0.0


@pytest.mark.parametrize("seed", [INT64_MIN, INT64_MAX])
def test_the_widest_values_sampling_params_accept_fit_the_wire(seed):
    widest = SamplingParams(max_tokens=UINT32_MAX, min_tokens=UINT32_MAX, top_k=INT32_MAX, seed=seed,
                            logit_bias={INT32_MAX: 1.0}, logprobs=20, stop_token_ids=(0, INT32_MAX))
    assert sampling_from_pb(sampling_to_pb(widest)) == widest


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": UINT32_MAX + 1}, "max_tokens"), ({"top_k": INT32_MAX + 1}, "top_k"),
    ({"seed": INT64_MAX + 1}, "seed"), ({"seed": INT64_MIN - 1}, "seed"),
    ({"logit_bias": {INT32_MAX + 1: 1.0}}, "logit_bias"), ({"stop_token_ids": (INT32_MAX + 1,)}, "stop_token_ids"),
    ({"stop_token_ids": (-1,)}, "stop_token_ids"), ({"temperature": float("inf")}, "temperature"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
])
def test_values_past_the_wire_types_are_refused_with_their_field(fields, param):
    with pytest.raises(SamplingParamsError) as refused:
        SamplingParams(**fields)
    assert refused.value.param == param


def test_structured_output_round_trips_for_every_kind():
    for kind in StructuredOutputKind:
        params = SamplingParams(structured_output=StructuredOutput(kind, f"spec of {kind.value}", any_whitespace=True))
        wire = common_pb2.SamplingParams.FromString(sampling_to_pb(params).SerializeToString())
        assert sampling_from_pb(wire) == params
    assert not sampling_to_pb(SamplingParams()).HasField("structured_output")


def test_step_input_round_trip_keeps_batch_order():
    step = StepInput(
        new_requests=[NewRequest("b", [1, 2, 3], 2, PARAMS, [7, 8], 0)],
        cached_requests=[CachedRequest("a", [9], 16)],
        num_scheduled_tokens={"b": 3, "a": 1},
        finished_req_ids=["z"],
        incarnation_id="w-1")
    pb = step_input_to_pb(step, step_id=4, traceparents={"b": "00-abc-def-01"})
    wire = worker_pb2.StepRequest.FromString(pb.SerializeToString())
    assert step_input_from_pb(wire) == step
    assert list(step_input_from_pb(wire).num_scheduled_tokens) == ["b", "a"]
    assert traceparents_from_pb(wire) == {"b": "00-abc-def-01"} and wire.step_id == 4


def test_step_output_round_trip_with_and_without_logprobs():
    output = StepOutput(req_ids=["a", "b"], sampled_token_ids=[3, 4], logprobs=[LOGPROBS, None], forward_time_ns=12,
                        sample_time_ns=3, idle_time_ns=7, incarnation_id="w-1",
                        failed=[FailedRequest("c", "bad id", True), FailedRequest("d", "nan", False)])
    assert step_output_from_pb(step_output_to_pb(output)) == output


def test_generate_request_and_chunks_round_trip():
    request = GenerateRequest("r1", [1, 2], PARAMS, cache_salt="tenant")
    back = generate_request_from_pb(generate_request_to_pb(request))
    assert (back.req_id, back.prompt_token_ids, back.sampling, back.cache_salt) == ("r1", [1, 2], PARAMS, "tenant")
    assert generate_request_from_pb(generate_request_to_pb(GenerateRequest("r2", [1], PARAMS))).cache_salt is None
    for output in (RequestOutput("r1", [3], [LOGPROBS], None, 2, 0, 1),
                   RequestOutput("r1", [3, 4], [None, None], FinishReason.LENGTH, 2, 16, 7)):
        assert output_from_chunk("r1", output_to_chunk(output)) == output


def test_priority_and_tenant_round_trip_and_unset_ones_are_the_defaults():
    request = GenerateRequest("r1", [1, 2], PARAMS, priority=-3, tenant="team-a", tenant_weight=2.5,
                              tenant_kv_cache_share=0.25)
    back = generate_request_from_pb(generate_request_to_pb(request))
    assert (back.priority, back.tenant, back.tenant_weight, back.tenant_kv_cache_share) == (-3, "team-a", 2.5, 0.25)
    unset = generate_request_from_pb(scheduler_pb2.GenerateRequest(req_id="r2", prompt_token_ids=[1]))
    # weight and share 0 on the wire: unset
    assert (unset.priority, unset.tenant, unset.tenant_weight, unset.tenant_kv_cache_share) == (0, "", 1.0, None)


def test_resumed_output_token_ids_round_trip_and_unset_is_empty():
    request = GenerateRequest("r1", [1, 2], PARAMS, resumed_output_token_ids=[7, 0, 49151])
    assert generate_request_from_pb(generate_request_to_pb(request)).resumed_output_token_ids == [7, 0, 49151]
    unset = generate_request_from_pb(scheduler_pb2.GenerateRequest(req_id="r2", prompt_token_ids=[1]))
    assert unset.resumed_output_token_ids == []


def test_every_wire_finish_reason_round_trips_and_handoff_is_its_own_value():
    for reason in (None, FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT, FinishReason.HANDOFF):
        output = RequestOutput("r1", [3], [None], reason, 2, 0, 5)
        assert output_from_chunk("r1", output_to_chunk(output)) == output
    assert output_to_chunk(RequestOutput("r1", [], [], FinishReason.HANDOFF, 2, 0, 5)).finish_reason == (
        scheduler_pb2.FINISH_REASON_HANDOFF)
    assert FinishReason.HANDOFF.value == "handoff"


def test_description_and_stats_round_trip():
    description = ModelDescription("m", "LlamaForCausalLM", 8192, 49152, 364, 16, (2, 0), "float32", "cpu", "torch",
                                    268369920, incarnation_id="w-1")
    assert description_from_pb(description_to_pb(description)) == description
    values = {f.name: (index % 2 == 0) if f.type == "bool" else (index + 0.5 if f.type == "float" else index + 1)
              for index, f in enumerate(STATS_FIELDS) if f.name not in DICT_FIELDS}
    stats = SchedulerStats(**values, num_finished={"stop": 3, "abort": 1},
                           kv_blocks_by_tenant={"team-a": 7, "team-b": 2})
    assert stats_from_pb(stats_to_pb(stats)) == stats


def test_stats_message_and_dataclass_have_the_same_fields():
    """One stats shape: the converter goes by field name, so neither side may grow a field alone."""
    message_fields = sorted(f.name for f in scheduler_pb2.SchedulerStats.DESCRIPTOR.fields)
    assert message_fields == sorted(f.name for f in STATS_FIELDS)


def test_integrity_report_round_trip():
    report = IntegrityReport(ok=False, problem="leak", num_blocks=10, num_free_blocks=5, num_cached_blocks=3,
                             num_used_blocks=2, num_live_requests=1, worker_incarnation_id="w-1")
    assert integrity_from_pb(integrity_to_pb(report)) == report


def test_prompt_logprobs_round_trip_on_both_contracts():
    """The sampling field (unset: None), the worker's per-request entries, and the chunk's list, where an empty list
    (a one-token prompt) stays distinct from none asked."""
    params = SamplingParams(prompt_logprobs=0)
    assert sampling_from_pb(sampling_to_pb(params)) == params
    assert sampling_from_pb(sampling_to_pb(PARAMS)).prompt_logprobs is None
    output = StepOutput(req_ids=["a"], sampled_token_ids=[3], logprobs=[None],
                        prompt_logprobs={"a": [LOGPROBS, LOGPROBS], "b": []})
    assert step_output_from_pb(step_output_to_pb(output)) == output
    for prompt in ([LOGPROBS], [], None):
        chunk = RequestOutput("r1", [3], [None], None, 2, 0, 1, prompt_logprobs=prompt)
        assert output_from_chunk("r1", output_to_chunk(chunk)) == chunk
