"""Finding 2 against the real stack: every out-of-range or unencodable input is a 4xx naming its field, streamed
or not; no 5xx; the pooled connection that carried it serves the next request (no reset); nothing is left
running in the scheduler."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.faults.gateway.stack import API_KEY, AUTH
from tests.unit.gateway.api.test_bad_input import CASES, SURROGATE

GOOD = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0.0}
EXTRA = {  # beyond the unit cases: /tokenize, and the two seeds through the official client below
    "lone surrogate in /tokenize": (("/tokenize", {"prompt": f"a{SURROGATE}"}), "prompt"),
    "lone surrogate in /tokenize messages": (("/tokenize", {"messages": [{"role": "user", "content": SURROGATE}]}),
                                             "messages.0.content"),
}


def test_no_bad_input_gets_a_5xx_or_breaks_the_pooled_connection(quiescent):
    stack = quiescent
    statuses, wrong = [], []
    with httpx.Client(base_url=stack.base_url, headers=AUTH, timeout=120) as pooled:
        for case, ((path, body), param) in {**CASES, **EXTRA}.items():
            for stream in (False, True) if path.startswith("/v1/") else (False,):
                sent = {**body, "stream": True} if stream else body
                response = pooled.post(path, content=json.dumps(sent), headers={"content-type": "application/json"})
                statuses.append(response.status_code)
                error = response.json().get("error", {}) if response.headers["content-type"].startswith(
                    "application/json") else {}
                if response.status_code != 400 or error.get("param") != param:
                    wrong.append((case, stream, response.status_code, response.text[:200]))
                # the same keep-alive connection carries the next request
                assert pooled.post("/v1/chat/completions", json=GOOD).status_code == 200, (case, stream)
    assert [s for s in statuses if s >= 500] == []
    assert wrong == []
    assert len(statuses) == 2 * len(CASES) + len(EXTRA)


@pytest.mark.parametrize("fields", [{"seed": 2**63}, {"seed": 2**64}, {"top_k": 3_000_000_000}],
                         ids=["seed 2**63", "seed 2**64", "top_k 3e9"])
def test_the_official_client_gets_a_bad_request_error_and_keeps_working(quiescent, fields):
    client = openai.OpenAI(base_url=quiescent.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="SmolLM2-135M-Instruct", **GOOD, extra_body=fields)
    assert refused.value.body["param"] == next(iter(fields))
    with pytest.raises(openai.BadRequestError):
        list(client.chat.completions.create(model="SmolLM2-135M-Instruct", **GOOD, extra_body=fields, stream=True))
    reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", **GOOD)
    assert reply.choices[0].finish_reason in ("stop", "length")
