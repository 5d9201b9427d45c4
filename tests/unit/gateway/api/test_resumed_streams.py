"""A replica failing or draining mid-request, through the HTTP API over two fake replicas: the client sees one
response (streamed or not) with every token once, its usage right, a stop string caught across the resume point,
the error event once the resume budget is spent; the resume counted in /metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import grpc.aio
import pytest
from fastapi.testclient import TestClient

from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.app import create_app
from pagedserve.services.gateway.config import GatewayConfig
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FailOnce, FakeSchedulerClient, fake_replicas

REPLY = "The capital of France is Paris. It is a lovely city on the Seine."
BODY = {"model": "tiny-model", "messages": [{"role": "user", "content": "Capital of France?"}]}


@contextmanager
def two_replicas(tokenizer, **config_fields) -> Iterator[tuple[TestClient, list[FakeSchedulerClient]]]:
    config = GatewayConfig(model_dir=str(MODEL_DIR), health_poll_interval_s=0.02, **config_fields)
    fakes = [FakeSchedulerClient(tokenizer, REPLY, instance_id=name) for name in ("a", "b")]
    state = Serving(config, tokenizer, fake_replicas(*fakes), generation_defaults={})
    with TestClient(create_app(state)) as client:
        deadline_s = time.monotonic() + 5
        while len(state.replicas.live()) < 2 and time.monotonic() < deadline_s:
            time.sleep(0.01)
        yield client, fakes


def unavailable(details: str = "worker lost") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def sse_chunks(response) -> list[dict]:
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def streamed_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))


def served_in_order(fakes: list[FakeSchedulerClient]) -> tuple[FakeSchedulerClient, FakeSchedulerClient]:
    first = next(fake for fake in fakes if fake.requests and not fake.requests[0].resumed_output_token_ids)
    return first, next(fake for fake in fakes if fake is not first)


@pytest.mark.parametrize("stream", [True, False])
def test_a_replica_failing_mid_answer_is_invisible_to_the_client(tokenizer, stream):
    with two_replicas(tokenizer) as (client, fakes):
        fakes[0].fail_once = fakes[1].fail_once = FailOnce(5, unavailable())
        response = client.post("/v1/chat/completions", json={**BODY, "stream": stream,
                                                             "stream_options": {"include_usage": True}} if stream
                               else BODY)
        metrics = client.get("/metrics").text
    assert response.status_code == 200
    if stream:
        chunks = sse_chunks(response)
        text, usage = streamed_text(chunks), chunks[-1]["usage"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and "error" not in response.text
    else:
        body = response.json()
        text, usage = body["choices"][0]["message"]["content"], body["usage"]
    assert text == REPLY
    first, second = served_in_order(fakes)
    num_reply, num_prompt = len(first.reply_ids), len(first.requests[0].prompt_token_ids)
    assert second.requests[0].resumed_output_token_ids == first.reply_ids[:5]
    assert second.requests[0].prompt_token_ids == first.requests[0].prompt_token_ids
    assert usage["prompt_tokens"] == num_prompt and usage["completion_tokens"] == num_reply
    assert 'pagedserve_requests_resumed_total{reason="replica_failed"} 1.0' in metrics
    assert 'pagedserve_requests_resumed_total{reason="drain"} 0.0' in metrics


def test_a_stop_string_straddling_the_resume_point_is_still_caught(tokenizer):
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    cut = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("France"))
    with two_replicas(tokenizer) as (client, fakes):
        fakes[0].fail_once = fakes[1].fail_once = FailOnce(cut, unavailable())
        response = client.post("/v1/chat/completions", json={**BODY, "stream": True, "stop": ["France is"]})
    chunks = sse_chunks(response)
    assert streamed_text(chunks) == "The capital of "  # "France" came from the first replica, " is" from the second
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    first, second = served_in_order(fakes)
    assert tokenizer.decode(second.requests[0].resumed_output_token_ids).endswith("France")
    assert second.cancelled  # the stop string ended the continuation: its request was aborted


def test_past_the_resume_budget_the_stream_ends_with_the_error_event(tokenizer):
    with two_replicas(tokenizer, max_resumes=0) as (client, fakes):
        fakes[0].fail_once = fakes[1].fail_once = FailOnce(3, unavailable())
        response = client.post("/v1/chat/completions", json={**BODY, "stream": True})
        metrics = client.get("/metrics").text
    chunks = sse_chunks(response)
    assert chunks[-1]["error"]["message"] == "the scheduler is unavailable: worker lost"
    assert streamed_text(chunks) == "The capital of"  # three tokens, then the error
    assert sum(len(fake.requests) for fake in fakes) == 1
    assert 'pagedserve_requests_resumed_total{reason="replica_failed"} 0.0' in metrics


def test_a_hand_off_from_a_draining_replica_continues_the_stream(tokenizer):
    with two_replicas(tokenizer, max_resumes=0) as (client, fakes):
        for fake in fakes:  # each hands a request off after 6 tokens: the continuation needs only 3 more
            fake.handoff_after = 6
        response = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "Paris", "stream": True,
                                                         "max_tokens": 9})
        metrics = client.get("/metrics").text
    chunks = sse_chunks(response)
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    first, _ = served_in_order(fakes)
    assert text == tokenizer.decode(first.reply_ids[:9]) and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "handoff" not in response.text
    assert 'pagedserve_requests_resumed_total{reason="drain"} 1.0' in metrics
