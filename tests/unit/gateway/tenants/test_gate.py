"""The tenant gate in the app against a fake scheduler: keys to tenants, per-tenant limits and their OpenAI
headers, the tenant's bounds on max_tokens, models and priority, and label values from fixed sets only."""

from __future__ import annotations

import asyncio
import json
import random
import string

import pytest

from pagedserve.services.gateway.http.metrics import GatewayMetrics
from pagedserve.services.gateway.tenants.gate import TenantGate
from pagedserve.services.gateway.tenants.metrics import TenantMetrics
from pagedserve.services.gateway.tenants.rate_limit import RateLimiter
from pagedserve.services.gateway.tenants.registry import TenantRegistry
from tests.unit.gateway.test_app import CHAT, gateway_with_state

KEYS = {"tenants": {
    "team-a": {"keys": ["sk-a"], "rpm": 3},
    "team-b": {"keys": ["sk-b"], "kv_cache_share": 0.25},
    "narrow": {"keys": ["sk-n"], "max_tokens": 5},
    "elsewhere": {"keys": ["sk-e"], "models": ["another-model"]},
    "urgent": {"keys": ["sk-u"], "priority": 2, "max_concurrent": 1},
}}


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def keys_file(tmp_path) -> str:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    return str(path)


def series(metrics_text: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in metrics_text.splitlines() if line and not line.startswith("#")}


def test_a_tenant_over_its_rpm_gets_openais_429_and_others_are_unaffected(tokenizer, tmp_path):
    with gateway_with_state(tokenizer, api_keys_file=keys_file(tmp_path)) as (client, fake, _):
        admitted = [client.post("/v1/chat/completions", json=CHAT, headers=auth("sk-a")) for _ in range(3)]
        refused = client.post("/v1/chat/completions", json=CHAT, headers=auth("sk-a"))
        other = client.post("/v1/chat/completions", json=CHAT, headers=auth("sk-b"))
        metrics = client.get("/metrics").text
    assert [r.status_code for r in admitted] == [200] * 3 and other.status_code == 200
    assert [r.headers["x-ratelimit-remaining-requests"] for r in admitted] == ["2", "1", "0"]
    assert admitted[0].headers["x-ratelimit-limit-requests"] == "3"
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert float(refused.headers["x-ratelimit-reset-requests"].removesuffix("s")) > 0
    assert 'pagedserve_gateway_tenant_rate_limited_total{limit="requests",tenant="team-a"} 1.0' in metrics
    assert 'pagedserve_gateway_tenant_requests_total{tenant="team-b"} 1.0' in metrics
    assert 'pagedserve_gateway_tenant_tokens_total{kind="generated",tenant="team-a"} 24.0' in metrics
    assert {r.tenant for r in fake.requests} == {"team-a", "team-b"}


def test_the_tenant_bounds_max_tokens_models_and_priority(tokenizer, tmp_path):
    with gateway_with_state(tokenizer, api_keys_file=keys_file(tmp_path)) as (client, fake, _):
        too_long = client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 6}, headers=auth("sk-n"))
        models = client.get("/v1/models", headers=auth("sk-e"))
        chat_elsewhere = client.post("/v1/chat/completions", json=CHAT, headers=auth("sk-e"))
        client.post("/v1/chat/completions", json={**CHAT, "priority": 0}, headers=auth("sk-u"))
        client.post("/v1/chat/completions", json={**CHAT, "priority": 9}, headers=auth("sk-u"))
        client.post("/v1/chat/completions", json=CHAT, headers=auth("sk-b"))
        bad_priority = client.post("/v1/chat/completions", json={**CHAT, "priority": 2**40}, headers=auth("sk-b"))
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    assert models.status_code == chat_elsewhere.status_code == 404
    assert chat_elsewhere.json()["error"]["code"] == "model_not_found"
    assert [(r.tenant, r.priority) for r in fake.requests] == [("urgent", 2), ("urgent", 9), ("team-b", 0)]
    assert bad_priority.status_code == 400 and bad_priority.json()["error"]["param"] == "priority"


@pytest.mark.asyncio
async def test_max_concurrent_counts_open_requests_per_tenant(tmp_path):
    registry = TenantRegistry(keys_file(tmp_path))
    release = asyncio.Event()

    async def slow_app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    metrics = GatewayMetrics()
    gate = TenantGate(slow_app, registry, RateLimiter(), metrics, TenantMetrics(metrics.registry),
                      lambda scope: "/v1/chat/completions")

    async def call(key: str) -> int:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/v1/chat/completions", "method": "POST",
                 "headers": [(b"authorization", f"Bearer {key}".encode())]}
        await gate(scope, None, send)
        return sent[0]["status"]

    first = asyncio.create_task(call("sk-u"))
    await asyncio.sleep(0.05)
    assert await call("sk-u") == 429  # the tenant's one slot is taken
    other = asyncio.create_task(call("sk-b"))
    await asyncio.sleep(0.05)
    assert not other.done()  # another tenant was admitted: it waits in the app, not refused
    release.set()
    assert await other == 200 and await first == 200
    assert await call("sk-u") == 200  # the slot is free again once the first ended


def test_random_paths_with_and_without_keys_add_no_series(tokenizer, tmp_path):
    rng = random.Random(41)

    def random_path() -> str:
        return "/v1/" + "".join(rng.choices(string.ascii_letters + string.digits + "/-_", k=rng.randint(1, 80)))

    with gateway_with_state(tokenizer, api_keys_file=keys_file(tmp_path)) as (client, _, _):
        for headers in ({}, auth("sk-b"), auth("sk-wrong")):  # every kind of answer once: 401, 404, 405
            client.get(random_path(), headers=headers)
            client.post(random_path(), headers=headers)
            client.get("/v1/models/" + random_path(), headers=headers)
        client.get("/metrics")  # its own series exist before the count
        before = series(client.get("/metrics").text)
        for i in range(1000):
            headers = (auth("sk-b"), {}, auth(f"sk-{i}"))[i % 3]
            (client.get if i % 2 else client.post)(random_path(), headers=headers)
        after = series(client.get("/metrics").text)
    assert after == before
    assert not any("/v1/" in s and "route=" in s and "{model_id" not in s and "completions" not in s
                   and 'route="/v1/models"' not in s for s in after)


def test_cache_salts_are_bound_to_the_tenant(tokenizer, tmp_path):
    """Two tenants never share a prefix-cache entry, even when one sends the other's cache_salt; one tenant's
    requests with the same salt (or none) share theirs. The scheduler salts the first block key with what it gets
    (tests/unit/scheduler: different salts, no shared block), so what it gets decides the isolation."""
    with gateway_with_state(tokenizer, api_keys_file=keys_file(tmp_path)) as (client, fake, _):
        for key, salt in [("sk-a", None), ("sk-a", None), ("sk-b", None), ("sk-a", "s1"), ("sk-b", "s1"),
                          ("sk-b", "team-a\x1fs1")]:
            body = CHAT if salt is None else {**CHAT, "cache_salt": salt}
            assert client.post("/v1/chat/completions", json=body, headers=auth(key)).status_code == 200
        metrics = client.get("/metrics").text
    a_none, a_none_again, b_none, a_s1, b_s1, b_copied = [r.cache_salt for r in fake.requests]
    assert a_none == a_none_again and len({a_none, b_none, a_s1, b_s1, b_copied}) == 5
    assert 'pagedserve_gateway_tenant_tokens_total{kind="cached",tenant="team-a"}' in metrics


def test_the_tenants_kv_cache_share_goes_with_its_requests(tokenizer, tmp_path):
    with gateway_with_state(tokenizer, api_keys_file=keys_file(tmp_path)) as (client, fake, _):
        for key in ("sk-a", "sk-b"):
            assert client.post("/v1/chat/completions", json=CHAT, headers=auth(key)).status_code == 200
    assert [(r.tenant, r.tenant_kv_cache_share) for r in fake.requests] == [("team-a", None), ("team-b", 0.25)]


def test_an_open_gateway_keeps_the_unsalted_cache_and_namespaces_a_sent_salt(tokenizer):
    with gateway_with_state(tokenizer) as (client, fake, _):
        client.post("/v1/chat/completions", json=CHAT)
        client.post("/v1/chat/completions", json={**CHAT, "cache_salt": "s1"})
    assert [r.cache_salt for r in fake.requests] == [None, "default\x1fs1"]
