"""The OpenAI surface a client probes first: GET /v1/models/{id}, a real `created`, CORS only when asked for, and
OPTIONS on any path never a 5xx."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest

from pagedserve.services.gateway.config import GatewayConfig
from tests.unit.gateway.app_client import app_client, serving
from tests.unit.gateway.conftest import MODEL_DIR
from tests.unit.gateway.fake_scheduler import FakeSchedulerClient

ORIGIN = "https://ui.example"
PREFLIGHT = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


@contextmanager
def gateway(tokenizer, **config):
    with app_client(serving(tokenizer, FakeSchedulerClient(tokenizer), **config)) as client:
        yield client, client.app


def test_retrieve_the_served_model_by_name_or_folder(tokenizer):
    before = int(time.time())
    with gateway(tokenizer) as (client, _):
        listed = client.get("/v1/models").json()["data"][0]
        by_name = client.get("/v1/models/tiny-model")
        by_folder = client.get(f"/v1/models/{MODEL_DIR}")
        missing = client.get("/v1/models/gpt-4")
    assert by_name.status_code == 200 and by_name.json() == listed == by_folder.json()
    assert listed["id"] == "tiny-model" and listed["object"] == "model" and listed["root"] == str(MODEL_DIR.resolve())
    assert before - 5 <= listed["created"] <= int(time.time())
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found" and missing.json()["error"]["param"] == "model"


def test_without_allowed_origins_there_is_no_cors_and_options_is_a_4xx(tokenizer):
    with gateway(tokenizer) as (client, _):
        preflight = client.options("/v1/chat/completions", headers=PREFLIGHT)
        plain = client.get("/v1/models", headers={"Origin": ORIGIN})
    assert preflight.status_code == 405
    assert preflight.json()["error"]["type"] == "invalid_request_error"
    assert "POST" in preflight.headers.get("allow", "")
    assert "access-control-allow-origin" not in preflight.headers and "access-control-allow-origin" not in plain.headers


@pytest.mark.parametrize("origins", [ORIGIN, f'["{ORIGIN}", "http://localhost:3000"]', "*"])
def test_allowed_origins_answer_preflights_before_the_api_key(tokenizer, origins):
    with gateway(tokenizer, allowed_origins=origins, api_key="k") as (client, _):
        preflight = client.options("/v1/chat/completions", headers=PREFLIGHT)
        listed = client.get("/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer k"})
        other = client.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in (ORIGIN, "*")
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] in (ORIGIN, "*")
    assert "x-request-id" in listed.headers.get("access-control-expose-headers", "").lower()
    assert other.status_code == (200 if origins == "*" else 400)


def test_a_bad_origins_list_is_refused_at_start():
    with pytest.raises(ValueError, match="--allowed-origins"):
        GatewayConfig(model_dir="m", allowed_origins='["https://a.example"')


@pytest.mark.parametrize("origins", ["", ORIGIN])
def test_options_on_every_route_is_never_a_5xx(tokenizer, origins):
    with gateway(tokenizer, allowed_origins=origins) as (client, app):
        paths = {route.path.replace("{model_id:path}", "tiny-model") for route in app.routes}
        for path in sorted(paths | {"/nowhere"}):
            for headers in ({}, PREFLIGHT):
                reply = client.options(path, headers=headers)
                assert reply.status_code < 500, (path, headers, reply.status_code, reply.text)


def test_root_is_absolute_when_served_from_a_relative_folder(tokenizer, monkeypatch):
    monkeypatch.chdir(MODEL_DIR.parent)
    with app_client(serving(tokenizer, FakeSchedulerClient(tokenizer), model_dir=MODEL_DIR.name)) as client:
        card = client.get("/v1/models").json()["data"][0]
        assert card["root"] == str(MODEL_DIR.resolve())  # a bench on this machine loads the tokenizer from it
        assert client.get(f"/v1/models/{MODEL_DIR.name}").status_code == 200
