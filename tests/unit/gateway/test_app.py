"""The gateway app against a fake scheduler: OpenAI shapes, streaming, stop strings, errors, auth, metrics."""

from __future__ import annotations

import json
from contextlib import contextmanager

import grpc
import grpc.aio
import pytest

from tests.unit.gateway.app_client import app_client
from tests.unit.gateway.app_client import serving as serving_state
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient

CHAT = {"model": "tiny-model", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


@contextmanager
def gateway_with_state(tokenizer, serving: bool = True, wait_ready: bool = True, **config_fields):
    """(client, fake scheduler, the app's Serving); config_fields override GatewayConfig's defaults."""
    fake = FakeSchedulerClient(tokenizer, serving=serving)
    state = serving_state(tokenizer, fake, **config_fields)
    with app_client(state, wait_ready) as client:
        yield client, fake, state


@contextmanager
def gateway(tokenizer, api_key: str | None = None, serving: bool = True, wait_ready: bool = True):
    with gateway_with_state(tokenizer, serving, wait_ready, api_key=api_key) as (client, fake, _):
        yield client, fake


def sse_chunks(response) -> list:
    lines = [line for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_chat_whole_and_streamed_give_the_same_text_and_usage(tokenizer):
    with gateway(tokenizer) as (client, fake):
        whole = client.post("/v1/chat/completions", json=CHAT).json()
        streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                              "stream_options": {"include_usage": True}})
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "The capital of France is Paris."}
    assert whole["choices"][0]["finish_reason"] == "stop"
    num_prompt = len(fake.requests[0].prompt_token_ids)
    assert whole["usage"] == {"prompt_tokens": num_prompt, "completion_tokens": len(fake.reply_ids),
                              "total_tokens": num_prompt + len(fake.reply_ids),
                              "prompt_tokens_details": {"cached_tokens": 0}}
    chunks = sse_chunks(streamed)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "The capital of France is Paris."
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])


def test_stop_string_cuts_and_aborts_the_request(tokenizer):
    with gateway(tokenizer) as (client, fake):
        whole = client.post("/v1/chat/completions", json={**CHAT, "stop": ["France"]}).json()
        streamed = client.post("/v1/chat/completions", json={**CHAT, "stop": "France", "stream": True})
    assert whole["choices"][0]["message"]["content"] == "The capital of "
    assert whole["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in sse_chunks(streamed))
    assert text == "The capital of "
    assert len(fake.cancelled) == 2  # both scheduler streams were closed early


def test_completions_echo_n_and_logprobs(tokenizer):
    with gateway(tokenizer) as (client, fake):
        echoed = client.post("/v1/completions", json={"prompt": "Q:", "echo": True, "max_tokens": 3}).json()
        several = client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2, "seed": 5,
                                                       "logprobs": 1, "max_tokens": 2}).json()
    assert echoed["choices"][0]["text"] == "Q:The capital of"
    assert echoed["choices"][0]["finish_reason"] == "length"
    assert [c["index"] for c in several["choices"]] == [0, 1, 2, 3]
    assert [r.sampling.seed for r in fake.requests[1:]] == [5, 6, 5, 6]
    assert {r.req_id.rsplit("-", 1)[1] for r in fake.requests[1:]} == {"0", "1", "2", "3"}
    logprobs = several["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["The", " capital"] and logprobs["token_logprobs"] == [-0.5, -0.5]
    assert logprobs["text_offset"] == [0, 3]
    assert several["usage"]["completion_tokens"] == 8 and several["usage"]["prompt_tokens"] == 2


def test_chat_logprobs_shape(tokenizer):
    with gateway(tokenizer) as (client, _):
        body = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 2,
                                                         "max_tokens": 1}).json()
    [entry] = body["choices"][0]["logprobs"]["content"]
    assert entry["token"] == "The" and entry["bytes"] == list(b"The") and entry["logprob"] == -0.5
    assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.5, -1.5]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ({**CHAT, "temperature": -1}, 400, "temperature"),
    ({**CHAT, "top_p": 1.5}, 400, "top_p"),
    ({**CHAT, "n": 0}, 400, "n"),
    ({**CHAT, "n": 17}, 400, "n"),
    ({**CHAT, "temperature": "hot"}, 400, "temperature"),
    ({**CHAT, "messages": []}, 400, "messages"),
    ({**CHAT, "messages": "hi"}, 400, "messages"),
    ({**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ({**CHAT, "model": "gpt-4"}, 404, "model"),
    ({**CHAT, "max_tokens": 250}, 400, "max_tokens"),
])
def test_bad_requests_get_openai_errors(tokenizer, body, status, param):
    with gateway(tokenizer) as (client, fake):
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # still serving


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT),
                                        ("/v1/completions", {"model": "tiny-model", "prompt": "Paris is"})])
def test_a_stream_the_scheduler_refuses_gets_a_json_error_status(tokenizer, path, body):
    """The refusal comes before any byte of the stream: its own 4xx with a JSON error, not an event in a 200."""
    with gateway(tokenizer) as (client, fake):
        fake.fail_after = (0, _rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "the whole pool holds 1024 tokens"))
        response = client.post(path, json={**body, "stream": True})
        assert response.status_code == 400
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["error"]["message"] == "the whole pool holds 1024 tokens"
        fake.fail_after = None
        assert client.post(path, json={**body, "stream": True}).status_code == 200  # still serving


def test_a_stream_that_fails_midway_ends_with_an_error_event(tokenizer):
    """Once tokens have gone out the status is sent: the error is the stream's last event, then [DONE]."""
    with gateway(tokenizer) as (client, fake):
        fake.fail_after = (2, _rpc_error(grpc.StatusCode.UNAVAILABLE, "worker lost"))
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    chunks = sse_chunks(response)
    assert "choices" in chunks[1] and chunks[-1]["error"]["message"] == "the scheduler is unavailable: worker lost"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fail_after", [0, 2])
def test_an_internal_failure_shows_the_request_id_never_the_exception(tokenizer, stream, fail_after):
    details = "internal error: IndexError: index 99999 is out of bounds for dimension 1 with size 49152"
    with gateway(tokenizer) as (client, fake):
        fake.fail_after = (fail_after, _rpc_error(grpc.StatusCode.INTERNAL, details))
        response = client.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                               headers={"X-Request-Id": "req-internal-1"})
    streamed = stream and fail_after > 0  # the status line went out with the first tokens
    assert response.status_code == (200 if streamed else 500)
    error = sse_chunks(response)[-1]["error"] if streamed else response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert "req-internal-1" in error["message"] and "IndexError" not in response.text and "99999" not in response.text


def test_malformed_json_is_400(tokenizer):
    with gateway(tokenizer) as (client, _):
        response = client.post("/v1/chat/completions", content=b'{"messages": [', headers={
            "content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_not_ready_means_503(tokenizer):
    with gateway(tokenizer, serving=False, wait_ready=False) as (client, _):
        assert client.get("/health").status_code == 503
        response = client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"


def test_api_key_is_required_on_v1_only(tokenizer):
    with gateway(tokenizer, api_key="sekret") as (client, _):
        missing = client.post("/v1/chat/completions", json=CHAT)
        wrong = client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        right = client.get("/v1/models", headers={"Authorization": "Bearer sekret"})
        health = client.get("/health")
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert right.json()["data"][0]["id"] == "tiny-model" and health.status_code == 200


def test_tokenize_detokenize_version_metrics(tokenizer):
    with gateway(tokenizer) as (client, _):
        tokens = client.post("/tokenize", json={"prompt": "Hello world"}).json()
        chat_tokens = client.post("/tokenize", json={"messages": CHAT["messages"]}).json()
        text = client.post("/detokenize", json={"tokens": tokens["tokens"]}).json()
        client.post("/v1/chat/completions", json=CHAT)
        version = client.get("/version").json()
        metrics = client.get("/metrics").text
    assert tokens == {"tokens": tokenizer.encode("Hello world"), "count": 2, "max_model_len": 256}
    assert chat_tokens["count"] == len(tokenizer.chat_prompt_ids(CHAT["messages"]))
    assert text == {"prompt": "Hello world"} and version["version"]
    for line in ('pagedserve_http_requests_total{route="/v1/chat/completions",status="200"} 1.0',
                 'pagedserve_http_request_duration_seconds_count{route="/v1/chat/completions"} 1.0',
                 'pagedserve_http_time_to_first_byte_seconds_count{route="/v1/chat/completions"} 1.0',
                 "pagedserve_http_requests_in_flight 1.0",  # the scrape itself
                 "pagedserve_gateway_scheduler_ready 1.0",
                 'pagedserve_gateway_routed_requests_total{replica="fake"} 1.0',
                 'pagedserve_gateway_replica_up{address="fake:1",replica="fake"} 1.0',
                 'pagedserve_gateway_prefix_index_up 0.0',
                 'pagedserve_gateway_routing_info{policy="prefix"} 1.0'):
        assert line in metrics.splitlines()


def test_metrics_hold_no_engine_figures_and_never_ask_the_scheduler(tokenizer):
    """Engine figures live on each scheduler's own /metrics: two gateways must not report them twice."""
    with gateway(tokenizer) as (client, fake):
        client.post("/v1/chat/completions", json=CHAT)
        fake.get_stats = None  # a scrape that called GetStats would fail
        metrics = client.get("/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if not line.startswith("#")}
    names -= {"pagedserve_requests_resumed_total", "pagedserve_requests_resumed_created"}  # issue 46's name; the
    # gateway alone resumes, so no engine reports it
    assert names and all(name.startswith(("pagedserve_http_", "pagedserve_gateway_")) for name in names), names


def test_livez_answers_while_the_scheduler_is_not_ready(tokenizer):
    with gateway(tokenizer, serving=False, wait_ready=False) as (client, _):
        assert client.get("/livez").status_code == 200
        assert client.get("/health").status_code == 503


def test_responses_name_the_replica_that_served_them(tokenizer):
    with gateway(tokenizer) as (client, _):
        whole = client.post("/v1/chat/completions", json=CHAT)
        streamed = client.post("/v1/completions", json={"prompt": "Paris is", "stream": True, "max_tokens": 2})
        refused = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 0})
    assert whole.headers["X-Pagedserve-Replica"] == streamed.headers["X-Pagedserve-Replica"] == "fake"
    assert "X-Pagedserve-Replica" not in refused.headers
