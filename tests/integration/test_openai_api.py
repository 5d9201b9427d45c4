"""The OpenAI API end to end through gateway -> scheduler -> worker, with the official client and raw httpx."""

from __future__ import annotations

import json

import httpx

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0.0}


def stream_text(client, model_name: str, **kwargs) -> tuple[str, list]:
    chunks = list(client.chat.completions.create(model=model_name, stream=True, **kwargs))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def test_capital_of_france_is_paris(client, model_name):
    reply = client.chat.completions.create(model=model_name, messages=FRANCE, max_tokens=16, **GREEDY)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_chat_streamed_and_whole_give_the_same_greedy_text(client, model_name):
    messages = [{"role": "user", "content": "Name three colors."}]
    whole = client.chat.completions.create(model=model_name, messages=messages, max_tokens=20, **GREEDY)
    text, chunks = stream_text(client, model_name, messages=messages, max_tokens=20,
                               stream_options={"include_usage": True}, **GREEDY)
    assert text == whole.choices[0].message.content and text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_streamed_and_whole_give_the_same_greedy_text(client, model_name):
    prompt = "The three primary colors are"
    whole = client.completions.create(model=model_name, prompt=prompt, max_tokens=12, **GREEDY)
    chunks = list(client.completions.create(model=model_name, prompt=prompt, max_tokens=12, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12


def test_usage_counts_and_cached_tokens(client, model_name, http):
    num_prompt = http.post("/tokenize", json={"messages": FRANCE}).json()["count"]
    kwargs = {"model": model_name, "messages": FRANCE, "max_tokens": 5, "extra_body": {"ignore_eos": True}}
    first = client.chat.completions.create(**kwargs, **GREEDY)
    second = client.chat.completions.create(**kwargs, **GREEDY)
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (num_prompt, 5)
    assert first.usage.total_tokens == num_prompt + 5 and first.choices[0].finish_reason == "length"
    # the second run finds every full block of the prompt cached (one token is always left to compute)
    assert second.usage.prompt_tokens_details.cached_tokens == (num_prompt - 1) // 16 * 16
    assert second.choices[0].message.content == first.choices[0].message.content


def test_stop_string_cuts_exactly_streamed_and_whole(client, model_name):
    full = client.chat.completions.create(model=model_name, messages=FRANCE, max_tokens=16, **GREEDY)
    text = full.choices[0].message.content
    stop = text[text.index("apital") + 2: text.index("apital") + 9]  # starts and ends inside tokens
    whole = client.chat.completions.create(model=model_name, messages=FRANCE, max_tokens=16, stop=[stop], **GREEDY)
    streamed, chunks = stream_text(client, model_name, messages=FRANCE, max_tokens=16, stop=stop, **GREEDY)
    assert whole.choices[0].message.content == streamed == text[:text.index(stop)]
    assert whole.choices[0].finish_reason == "stop"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_raw_sse_stream_ends_with_done(http, model_name):
    body = {"model": model_name, "prompt": "Hello", "max_tokens": 3, "stream": True,
            "stream_options": {"include_usage": True}, **GREEDY}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    usage = json.loads(events[-2][len("data: "):])["usage"]
    assert usage["completion_tokens"] == 3
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}  # one prompt token: no full block to cache


def test_n_choices_logprobs_and_seed(client, model_name):
    reply = client.chat.completions.create(model=model_name, messages=FRANCE, max_tokens=6, n=2, seed=11,
                                           temperature=1.0, logprobs=True, top_logprobs=3)
    again = client.chat.completions.create(model=model_name, messages=FRANCE, max_tokens=6, n=2, seed=11,
                                           temperature=1.0, logprobs=True, top_logprobs=3)
    assert [c.index for c in reply.choices] == [0, 1]
    assert [c.message.content for c in reply.choices] == [c.message.content for c in again.choices]
    for choice in reply.choices:
        num_tokens = len(choice.logprobs.content)
        assert num_tokens == 6 if choice.finish_reason == "length" else choice.finish_reason == "stop" and num_tokens
        assert all(len(entry.top_logprobs) == 3 for entry in choice.logprobs.content)
        assert all(entry.logprob <= 0 for entry in choice.logprobs.content)
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)


def test_completions_echo_and_token_prompt(client, model_name, http):
    ids = http.post("/tokenize", json={"prompt": "The sky is"}).json()["tokens"]
    by_text = client.completions.create(model=model_name, prompt="The sky is", max_tokens=4, echo=True, **GREEDY)
    by_ids = client.completions.create(model=model_name, prompt=ids, max_tokens=4, **GREEDY)
    assert by_text.choices[0].text == "The sky is" + by_ids.choices[0].text


def test_models_version_tokenize_detokenize_metrics(http, model_name, stack):
    models = http.get("/v1/models").json()
    assert models["data"][0]["id"] == model_name and models["data"][0]["max_model_len"] == 8192
    assert http.get("/version").json()["version"]
    tokens = http.post("/tokenize", json={"prompt": "Paris is lovely"}).json()["tokens"]
    assert http.post("/detokenize", json={"tokens": tokens}).json()["prompt"] == "Paris is lovely"
    http_metrics = http.get("/metrics").text  # the gateway: HTTP figures only
    assert 'pagedserve_http_requests_total{route="/tokenize",status="200"}' in http_metrics
    assert "pagedserve_gateway_scheduler_ready 1.0" in http_metrics.splitlines()
    assert "pagedserve_kv_cache_usage_perc" not in http_metrics
    engine_metrics = httpx.get(stack.scheduler_metrics_url).text  # the scheduler's own
    for name in ("pagedserve_prefix_cache_hits_total", "pagedserve_prefix_cache_queries_total",
                 "pagedserve_num_preemptions_total", "pagedserve_kv_cache_usage_perc",
                 "pagedserve_num_requests_running", "pagedserve_num_requests_waiting",
                 "pagedserve_e2e_request_latency_seconds_count", "pagedserve_time_to_first_token_seconds_count"):
        assert any(line.startswith(name + "{") and f'model_name="{model_name}"' in line
                   for line in engine_metrics.splitlines()), name
    assert f'pagedserve_gateway_replica_up{{address="127.0.0.1:{stack.scheduler_port}",replica="itest"}} 1.0' \
        in http_metrics.splitlines()
