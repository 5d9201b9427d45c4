"""Prompt logprobs on the API against a fake scheduler: `echo` with `logprobs` in OpenAI's legacy lists (the shape
lm-evaluation-harness's local-completions reads), `max_tokens: 0` with them, vLLM's `prompt_logprobs` on
completions (per choice) and chat (per response), and the 400s."""

from __future__ import annotations

from tests.unit.gateway.structured.test_tool_calls_api import gateway

PROMPT_IDS = [504, 3458, 314, 4649, 28, 1012]  # token ids, as lm-eval sends them


def fake_value(i: int) -> float:
    """The fake scheduler's logprob of prompt token i (i >= 1)."""
    return -i / 4


def test_echo_with_logprobs_lists_the_prompt_then_the_completion(tokenizer):
    with gateway(tokenizer, "Paris is big") as (client, fake, _):
        answer = client.post("/v1/completions", json={"model": "tiny-model", "prompt": PROMPT_IDS, "echo": True,
                                                      "max_tokens": 1, "logprobs": 1, "temperature": 0})
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    lp = choice["logprobs"]
    assert fake.requests[0].sampling.prompt_logprobs == 1 and fake.requests[0].sampling.max_tokens == 1
    first_reply_id = fake.reply_ids[0]
    assert lp["tokens"] == [tokenizer.token_text(t) for t in [*PROMPT_IDS, first_reply_id]]
    assert lp["token_logprobs"] == [None, *(fake_value(i) for i in range(1, len(PROMPT_IDS))), -0.5]
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1:-1] == [{tokenizer.token_text(11): -0.125}] * (len(PROMPT_IDS) - 1)
    assert lp["top_logprobs"][-1] == {tokenizer.token_text(first_reply_id): -0.5}
    offsets = [0]
    for token in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp["text_offset"] == offsets
    assert choice["text"] == tokenizer.decode(PROMPT_IDS) + tokenizer.token_text(first_reply_id)
    # lm-eval's parse_logprobs: the continuation's logprobs are token_logprobs[ctxlen:-1]
    ctxlen = 4
    assert sum(lp["token_logprobs"][ctxlen:-1]) == sum(fake_value(i) for i in range(ctxlen, len(PROMPT_IDS)))


def test_echo_logprobs_with_max_tokens_zero_show_no_output(tokenizer):
    with gateway(tokenizer, "Paris") as (client, fake, _):
        answer = client.post("/v1/completions", json={"model": "tiny-model", "prompt": [PROMPT_IDS, PROMPT_IDS[:3]],
                                                      "echo": True, "max_tokens": 0, "logprobs": 0})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [r.sampling.max_tokens for r in fake.requests] == [1, 1]  # the step at the last position samples one
    assert [len(c["logprobs"]["tokens"]) for c in body["choices"]] == [len(PROMPT_IDS), 3]
    assert body["choices"][1]["logprobs"]["token_logprobs"] == [None, fake_value(1), fake_value(2)]
    assert body["choices"][1]["logprobs"]["top_logprobs"] == [None, {}, {}]
    assert [c["text"] for c in body["choices"]] == [tokenizer.decode(PROMPT_IDS), tokenizer.decode(PROMPT_IDS[:3])]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == len(PROMPT_IDS) + 3


def test_vllm_prompt_logprobs_on_completions_and_chat(tokenizer):
    with gateway(tokenizer, "Paris") as (client, fake, _):
        completion = client.post("/v1/completions", json={"model": "tiny-model", "prompt": PROMPT_IDS,
                                                          "max_tokens": 2, "prompt_logprobs": 2})
        chat = client.post("/v1/chat/completions", json={"model": "tiny-model", "prompt_logprobs": 0,
                                                         "messages": [{"role": "user", "content": "Hi"}]})
    assert completion.status_code == 200, completion.text
    choice = completion.json()["choices"][0]
    assert choice["logprobs"] is None and choice["text"] == "Paris"
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(PROMPT_IDS) and entries[0] is None
    for i, (token_id, entry) in enumerate(zip(PROMPT_IDS[1:], entries[1:], strict=True), 1):
        assert entry == {"11": {"logprob": -0.125, "rank": 1, "decoded_token": tokenizer.token_text(11)},
                         str(token_id): {"logprob": fake_value(i), "rank": 2,
                                         "decoded_token": tokenizer.token_text(token_id)}}
    assert chat.status_code == 200, chat.text
    chat_prompt = fake.requests[1].prompt_token_ids
    whole = chat.json()
    assert "prompt_logprobs" not in whole["choices"][0]
    assert len(whole["prompt_logprobs"]) == len(chat_prompt) and whole["prompt_logprobs"][0] is None
    assert whole["prompt_logprobs"][1] == {str(chat_prompt[1]): {
        "logprob": fake_value(1), "rank": 2, "decoded_token": tokenizer.token_text(chat_prompt[1])}}


def test_prompt_logprobs_refusals(tokenizer):
    with gateway(tokenizer, "Paris") as (client, fake, _):
        streamed = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "Hi", "echo": True,
                                                        "logprobs": 1, "stream": True})
        chat_streamed = client.post("/v1/chat/completions", json={
            "model": "tiny-model", "prompt_logprobs": 1, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]})
        too_many = client.post("/v1/completions", json={"model": "tiny-model", "prompt": "Hi", "prompt_logprobs": 21})
    assert [r.status_code for r in (streamed, chat_streamed, too_many)] == [400, 400, 400]
    assert [r.json()["error"]["param"] for r in (streamed, chat_streamed, too_many)] == [
        "stream", "stream", "prompt_logprobs"]
    assert not fake.requests
