"""Redis is an observability copy: it can die mid-run without failing a request, and writes resume after."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.processes import wait_for

BODY = {"messages": [{"role": "user", "content": "Count from one to twenty."}], "max_tokens": 24,
        "ignore_eos": True, "temperature": 0.0, "stream": True}


async def stream_one(http: httpx.AsyncClient, index: int, started: asyncio.Event, counter: list[int]) -> str:
    finish = None
    async with http.stream("POST", "/v1/chat/completions", json=BODY, headers={"X-Request-Id": f"redis-{index}"}
                           ) as response:
        assert response.status_code == 200
        seen_first = False
        async for line in response.aiter_lines():
            if '"content"' in line and not seen_first:
                seen_first = True
                counter[0] += 1
                if counter[0] == 8:
                    started.set()
            if '"finish_reason": "' in line:
                finish = line.split('"finish_reason": "')[1].split('"')[0]
    return finish


def test_redis_killed_mid_run_then_restarted(stack, scheduler_stats):
    redis_server = stack.redis
    request_key = stack.redis_key("request:redis-0")
    before = scheduler_stats()

    async def main() -> list[str]:
        started, counter = asyncio.Event(), [0]
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=120) as http:
            tasks = [asyncio.create_task(stream_one(http, i, started, counter)) for i in range(8)]
            await asyncio.wait_for(started.wait(), 60)
            redis_server.kill()  # all 8 are generating now
            return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == ["length"] * 8
    down = wait_for(lambda: (s := scheduler_stats()).num_state_writes_dropped > before.num_state_writes_dropped
                    and not s.state_store_connected and s, 5, what="dropped writes counted")
    assert down.num_finished.get("length", 0) >= before.num_finished.get("length", 0) + 8

    redis_server.start()  # a fresh, empty Redis on the same port
    client = redis_server.client()
    assert client.hgetall(request_key) == {}
    response = httpx.post(stack.base_url + "/v1/chat/completions", timeout=60, headers={"X-Request-Id": "after-redis"},
                          json={**BODY, "stream": False, "max_tokens": 2})
    assert response.status_code == 200
    state = wait_for(lambda: (h := client.hgetall(stack.redis_key("request:after-redis"))).get("status") == "finished"
                     and h, 5, what="request state written after Redis returned")
    assert state["finish_reason"] == "length" and state["num_output_tokens"] == "2"
    assert int(state["num_prompt_tokens"]) > 0 and float(state["first_token_time_s"]) >= float(state["arrival_time_s"])
    assert wait_for(lambda: client.scard(stack.redis_key("prefix_blocks")) > 0, 5, what="prefix index rewritten")
    assert float(client.hget(stack.redis_key("stats"), "updated_at_s")) > time.time() - 5
    assert scheduler_stats().state_store_connected
