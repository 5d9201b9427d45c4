"""Tenants across real gateway processes and a real Redis: a tenant's RPM and TPM are shared by two gateways,
a key is reloaded without a restart, and 1,000 random unauthenticated paths add no metric series."""

from __future__ import annotations

import json
import os
import random
import string
import time

import httpx
import pytest

from tests.integration.gateway_processes import start_fake_scheduler, start_gateway
from tests.integration.processes import RedisServer, wait_for

CHAT = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
KEYS = {"tenants": {"team-a": {"keys": ["sk-team-a"], "rpm": 60},
                    "team-t": {"keys": ["sk-team-t"], "tpm": 200},
                    "team-b": {"keys": ["sk-team-b"]}}}


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory):
    tmp_dir = tmp_path_factory.mktemp("tenants")
    keys_path = tmp_dir / "keys.json"
    keys_path.write_text(json.dumps(KEYS))
    redis_server = RedisServer(tmp_dir / "redis.log")
    redis_server.start()
    scheduler = start_fake_scheduler(tmp_dir)
    started = []
    try:
        for _ in range(2):
            started.append(start_gateway(tmp_dir, scheduler.port, "--api-keys-file", str(keys_path),
                                         "--api-keys-poll-interval-s", "0.2", "--redis-url", redis_server.url,
                                         "--routing", "round-robin"))
        yield started, keys_path, redis_server
    finally:
        for proc in started:
            proc.stop()
        scheduler.stop()
        redis_server.kill()


def test_the_61st_request_in_a_minute_is_a_429_on_either_gateway(two_gateways):
    (one, two), _, _ = two_gateways
    with httpx.Client(timeout=30) as client:
        answers = [client.post((one, two)[i % 2].base_url + "/v1/chat/completions", json=CHAT,
                               headers=auth("sk-team-a")) for i in range(60)]
        refused = [client.post(g.base_url + "/v1/chat/completions", json=CHAT, headers=auth("sk-team-a"))
                   for g in (one, two)]
        other = client.post(two.base_url + "/v1/chat/completions", json=CHAT, headers=auth("sk-team-b"))
        metrics = client.get(one.base_url + "/metrics").text
    assert [a.status_code for a in answers] == [200] * 60, [a.text for a in answers if a.status_code != 200][:2]
    assert int(answers[-1].headers["x-ratelimit-remaining-requests"]) <= 1  # refilled ~1 a second meanwhile
    for response in refused:
        assert response.status_code == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
        assert response.headers["x-ratelimit-limit-requests"] == "60"
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert int(response.headers["retry-after"]) >= 1 and response.headers["x-ratelimit-reset-requests"]
    assert other.status_code == 200  # another tenant is unaffected
    assert "pagedserve_gateway_rate_limits_shared 1.0" in metrics


def test_a_tenants_tokens_per_minute_are_shared_too(two_gateways):
    (one, two), _, _ = two_gateways
    with httpx.Client(timeout=30) as client:
        statuses = []
        for i in range(40):  # each request spends its prompt + 3 generated tokens of the 200
            response = client.post((one, two)[i % 2].base_url + "/v1/chat/completions", json=CHAT,
                                   headers=auth("sk-team-t"))
            statuses.append(response.status_code)
            if response.status_code == 429:
                break
            time.sleep(0.05)  # the tokens are taken just after the response
    assert statuses[-1] == 429 and 200 in statuses
    assert response.headers["x-ratelimit-limit-tokens"] == "200"
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == 0
    with httpx.Client(timeout=30) as client:
        again = [client.post(g.base_url + "/v1/chat/completions", json=CHAT, headers=auth("sk-team-t")).status_code
                 for g in (one, two)]
    assert again == [429, 429]


def test_a_key_is_reloaded_without_a_restart(two_gateways):
    (one, two), keys_path, _ = two_gateways
    changed = {"tenants": {**KEYS["tenants"], "team-b": {"keys": ["sk-team-b-rotated"]}}}
    keys_path.write_text(json.dumps(changed))
    os.utime(keys_path, ns=(time.time_ns(), time.time_ns() + 10**9))

    def rotated(gateway) -> bool:
        new = httpx.get(gateway.base_url + "/v1/models", headers=auth("sk-team-b-rotated"), timeout=5)
        return new.status_code == 200

    try:
        for gateway in (one, two):
            wait_for(lambda g=gateway: rotated(g), 10, interval_s=0.1, what="the rotated key accepted")
            old = httpx.get(gateway.base_url + "/v1/models", headers=auth("sk-team-b"), timeout=5)
            assert old.status_code == 401
            assert "sk-team-b" not in gateway.log()
    finally:
        keys_path.write_text(json.dumps(KEYS))
        for gateway in (one, two):
            wait_for(lambda g=gateway: httpx.get(g.base_url + "/v1/models", headers=auth("sk-team-b"),
                                                 timeout=5).status_code == 200, 10, what="the old key back")


def series(metrics_text: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in metrics_text.splitlines() if line and not line.startswith("#")}


def test_1000_random_paths_with_and_without_keys_add_no_series(two_gateways):
    (one, _), _, _ = two_gateways
    rng = random.Random(41)
    alphabet = string.ascii_letters + string.digits + "-_/%"

    def path() -> str:
        return "/v1/" + "".join(rng.choices(alphabet, k=rng.randint(1, 200)))

    with httpx.Client(base_url=one.base_url, timeout=30) as client:
        for headers in ({}, auth("sk-team-b"), auth("sk-wrong")):
            client.get(path(), headers=headers)
            client.post(path(), headers=headers)
            client.get("/v1/models/x" + path(), headers=headers)
        client.get("/metrics")
        before = series(client.get("/metrics").text)
        for i in range(1000):
            headers = ({}, auth("sk-team-b"), auth(f"sk-guess-{i}"))[i % 3]
            (client.get if i % 2 else client.post)(path(), headers=headers)
        after = series(client.get("/metrics").text)
    assert after - before == set() and len(after) == len(before)


def test_limits_go_per_gateway_when_redis_dies_and_requests_still_flow(two_gateways):
    (one, _), _, redis_server = two_gateways
    redis_server.kill()
    try:
        start_s = time.monotonic()
        response = httpx.post(one.base_url + "/v1/chat/completions", json=CHAT, headers=auth("sk-team-b"),
                              timeout=30)
        assert response.status_code == 200
        limited = httpx.post(one.base_url + "/v1/chat/completions", json=CHAT, headers=auth("sk-team-a"),
                             timeout=30)
        assert limited.status_code in (200, 429) and time.monotonic() - start_s < 5
        assert "pagedserve_gateway_rate_limits_shared 0.0" in httpx.get(one.base_url + "/metrics").text
    finally:
        redis_server.start()
