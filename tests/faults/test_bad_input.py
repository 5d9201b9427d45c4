"""A bad request fails alone, as a 4xx naming its field, whether it comes through the gateway or straight to the
scheduler; healthy streams sharing its steps are unharmed. The services' gRPC ports refuse callers without the
internal token (health stays open for probes)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pagedserve.services.proto_convert.scheduler_contract import generate_request_to_pb
from pagedserve.services.proto_gen import common_pb2, scheduler_pb2, worker_pb2_grpc
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.faults.clients import chat_body, join, start_streams

STORY = chat_body("Tell me a story about a lighthouse.", max_tokens=48, ignore_eos=True)
BAD = {
    "logit_bias past the vocabulary": ({"logit_bias": {"49152": 5}}, "logit_bias"),
    "logit_bias far past the vocabulary": ({"logit_bias": {"2000000000": 5}}, "logit_bias"),
    "stop_token_ids past the vocabulary": ({"stop_token_ids": [10, 49152]}, "stop_token_ids"),
    "negative logit_bias id": ({"logit_bias": {"-1": 5}}, "logit_bias"),
}


def test_bad_token_ids_are_400_and_step_mates_finish(healthy):
    stack = healthy
    threads, results = start_streams(stack, 3, STORY)
    for case, (fields, param) in BAD.items():
        for stream in (False, True):
            response = stack.http.post("/v1/chat/completions", json={**STORY, **fields, "stream": stream})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, (case, response.text)
    join(threads, 120)
    assert [(r.status, r.done, r.error) for r in results] == [(200, True, None)] * 3


def test_the_scheduler_itself_refuses_an_out_of_vocabulary_logit_bias(healthy):
    stack = healthy
    threads, results = start_streams(stack, 3, STORY)
    request = GenerateRequest("direct-bad-bias", [1, 2, 3], SamplingParams(max_tokens=4, logit_bias={10**9: 1.0}))
    with pytest.raises(grpc.RpcError) as refused:
        list(stack.stub.Generate(generate_request_to_pb(request), timeout=30, metadata=stack.metadata()))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "logit_bias" in refused.value.details()
    join(threads, 120)
    assert [(r.status, r.done, r.error) for r in results] == [(200, True, None)] * 3


def test_internal_ports_refuse_callers_without_the_token(healthy):
    stack = healthy
    with pytest.raises(grpc.RpcError) as no_token:
        stack.stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
    assert no_token.value.code() is grpc.StatusCode.UNAUTHENTICATED
    request = generate_request_to_pb(GenerateRequest("sneaky", [1, 2, 3], SamplingParams(max_tokens=2)))
    with pytest.raises(grpc.RpcError) as wrong_token:
        list(stack.stub.Generate(request, timeout=5, metadata=(("x-pagedserve-token", "guess"),)))
    assert wrong_token.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with grpc.insecure_channel(f"127.0.0.1:{stack.worker_port}") as channel:
        with pytest.raises(grpc.RpcError) as worker_refused:
            worker_pb2_grpc.WorkerServiceStub(channel).Describe(common_pb2.DescribeRequest(), timeout=5)
        assert worker_refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="pagedserve.v1.WorkerService"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING  # probes need no secret
    assert stack.stats().num_running == 0  # with the token it answers
