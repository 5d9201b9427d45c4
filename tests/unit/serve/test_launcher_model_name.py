"""The ready banner's model name: from the gateway's /v1/models, or, behind a keys file the launcher holds no key
of, the name the worker serves under (before, `serve --api-keys-file` died at start on the 401's body)."""

from __future__ import annotations

import httpx

from pagedserve.services import launcher
from pagedserve.services.serve_config import parse_serve_config

MODEL = "models/SmolLM2-135M-Instruct"


def _client(status: int, body: dict) -> httpx.Client:
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(status, json=body)

    client = httpx.Client(base_url="http://gateway", transport=httpx.MockTransport(answer))
    client.seen = seen  # type: ignore[attr-defined]
    return client


def test_the_gateway_names_the_model_when_it_answers():
    config = parse_serve_config([MODEL, "--api-key", "sk-launcher-test"], "pagedserve serve")
    client = _client(200, {"data": [{"id": "served-name"}]})
    assert launcher.served_model_name(config, client) == "served-name"
    assert client.seen == ["Bearer sk-launcher-test"]


def test_behind_a_keys_file_without_a_key_the_worker_s_name_is_used(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text('{"tenants": {"team-a": {"keys": ["sk-a1"]}}}')
    unauthorized = {"error": {"type": "invalid_request_error", "code": "invalid_api_key"}}
    config = parse_serve_config([MODEL, "--api-keys-file", str(keys)], "pagedserve serve")
    assert launcher.served_model_name(config, _client(401, unauthorized)) == "SmolLM2-135M-Instruct"
    named = parse_serve_config([MODEL, "--api-keys-file", str(keys), "--served-model-name", "smol"],
                               "pagedserve serve")
    assert launcher.served_model_name(named, _client(401, unauthorized)) == "smol"
