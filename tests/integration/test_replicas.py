"""Two real replicas (2 workers + 2 schedulers) behind gateways, with a real Redis.

- Shared prompts: 4 system prompts of ~1,000 tokens x 8 users each. With prefix routing, >= 85% of the prompt
  tokens after each prefix's first request are served from cache (usage.prompt_tokens_details.cached_tokens) and
  every prefix stays on one replica; the same workload (fresh prompts) through round-robin does clearly worse.
- A scheduler that stops answering (SIGSTOP) is out of routing within 5 s, requests routed to it before that are
  retried on the other replica, and it is back once it answers again.
- kill -9 of one replica's worker mid-run: its streams are resumed on the other replica and finish (without
  --batch-invariant their text may differ from an undisturbed run: test_resumption.py checks exactness), and the
  other replica serves every new request. Nothing hangs.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.integration.replica_stack import REPLICA_IDS, ReplicaStack, running_replica_stack

NUM_GROUPS, NUM_USERS = 4, 8
WORDS = ("policy", "travel", "expense", "manager", "approve", "receipt", "hotel", "flight", "budget", "report",
         "team", "client", "meeting", "office", "remote", "holiday", "contract", "invoice", "deadline", "review",
         "safety", "training", "laptop", "access", "account", "payment", "limit", "request", "form", "notice")
REQUEST_TIMEOUT_S = 300
BLOCK_SIZE = 16  # the schedulers' KV block size


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[ReplicaStack]:
    with running_replica_stack(tmp_path_factory.mktemp("replicas")) as stack:
        yield stack


def system_prompt(seed: int) -> str:
    rng = random.Random(seed)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(75)]
    return f"Handbook {seed}. " + " ".join(sentences)


@dataclass
class Reply:
    group: int
    user: int
    replica: str
    num_prompt_tokens: int
    num_cached_tokens: int


async def ask(http: httpx.AsyncClient, system: str, group: int, user: int) -> Reply:
    body = {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": f"I am user {user}. What does rule {user * 7 + group} say?"}],
            "max_tokens": 4, "temperature": 0.0}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return Reply(group, user, response.headers["x-pagedserve-replica"], usage["prompt_tokens"],
                 usage["prompt_tokens_details"]["cached_tokens"])


async def indexed_blocks(http: httpx.AsyncClient) -> int:
    """Cached blocks of all replicas in the gateway's prefix index."""
    text = (await http.get("/metrics")).text
    return int(sum(metric(text, "pagedserve_gateway_prefix_index_blocks", replica) for replica in REPLICA_IDS))


async def wait_indexed(http: httpx.AsyncClient, num_blocks: int, timeout_s: float = 30) -> float:
    """Seconds until the gateway's prefix index holds at least `num_blocks` blocks."""
    start_s = time.monotonic()
    while await indexed_blocks(http) < num_blocks:
        assert time.monotonic() - start_s < timeout_s, f"the prefix index did not reach {num_blocks} blocks"
        await asyncio.sleep(0.05)
    return time.monotonic() - start_s


async def shared_prefix_workload(base_url: str, seeds: list[int], indexed: bool = False) -> list[Reply]:
    """Each prefix's first request (all four at once), then (for a gateway with a prefix index, once it holds their
    blocks: publication lag is not what this measures) the other 28 in a shuffled order, 6 at a time."""
    prompts = [system_prompt(seed) for seed in seeds]
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as http:
        before = await indexed_blocks(http) if indexed else 0
        firsts = await asyncio.gather(*(ask(http, prompts[g], g, 0) for g in range(NUM_GROUPS)))
        if indexed:
            lag_s = await wait_indexed(http, before + sum(r.num_prompt_tokens // BLOCK_SIZE for r in firsts))
            print(f"\nthe first requests' blocks were in the prefix index {lag_s:.2f}s after their answers")
        rest = [(g, u) for g in range(NUM_GROUPS) for u in range(1, NUM_USERS)]
        random.Random(seeds[0]).shuffle(rest)
        limit = asyncio.Semaphore(6)

        async def limited(group: int, user: int) -> Reply:
            async with limit:
                return await ask(http, prompts[group], group, user)

        return [*firsts, *await asyncio.gather(*(limited(g, u) for g, u in rest))]


def cached_share(replies: list[Reply]) -> float:
    followers = [r for r in replies if r.user > 0]
    return sum(r.num_cached_tokens for r in followers) / sum(r.num_prompt_tokens for r in followers)


def test_prefix_routing_caches_far_more_than_round_robin(replicas):
    prefix = asyncio.run(shared_prefix_workload(replicas.base_url("prefix"), [101, 102, 103, 104], indexed=True))
    round_robin = asyncio.run(shared_prefix_workload(replicas.base_url("round-robin"), [201, 202, 203, 204]))
    assert all(900 <= r.num_prompt_tokens <= 1400 for r in prefix + round_robin), "prompts of ~1,000 tokens"
    prefix_share, round_robin_share = cached_share(prefix), cached_share(round_robin)
    print(f"\ncached share of prompt tokens after each prefix's first request: prefix {prefix_share:.3f}, "
          f"round-robin {round_robin_share:.3f}")
    assert prefix_share >= 0.85
    assert round_robin_share <= prefix_share - 0.05
    for group in range(NUM_GROUPS):  # one replica per prefix under prefix routing; both under round-robin
        assert len({r.replica for r in prefix if r.group == group}) == 1, [r for r in prefix if r.group == group]
        assert len({r.replica for r in round_robin if r.group == group}) == 2
    assert {r.replica for r in prefix} == set(REPLICA_IDS)  # the prefixes spread over both


def metric(text: str, name: str, replica: str, label: str = "replica") -> float:
    line = next((line for line in text.splitlines() if line.startswith(name + "{") and f'{label}="{replica}"' in line),
                None)
    return 0.0 if line is None else float(line.rsplit(" ", 1)[1])


def wait_for(condition, timeout_s: float, what: str) -> float:
    """Seconds until the condition held."""
    start_s = time.monotonic()
    while not condition():
        if time.monotonic() - start_s > timeout_s:
            raise AssertionError(f"{what} not within {timeout_s}s")
        time.sleep(0.1)
    return time.monotonic() - start_s


def wait_idle(replicas: ReplicaStack) -> None:
    """Until the prefix gateway counts no request on either replica: a replica's published load is a copy made
    every 0.1 s, and one stopped (SIGSTOP) right after its last request would keep a stale count that routing
    heeds (it once sent a whole burst to the other replica)."""
    wait_for(lambda: set(replicas.replica_loads("prefix").values()) == {0.0}, 10, "both replicas idle")


def test_a_hung_scheduler_is_out_within_5s_its_requests_retried_and_back_when_it_answers(replicas):
    base_url = replicas.base_url("prefix")
    wait_idle(replicas)
    retries_before = metric(httpx.get(base_url + "/metrics").text, "pagedserve_gateway_route_retries_total",
                            "replica-0")
    replicas.schedulers[0].signal(signal.SIGSTOP)
    stopped_s = time.monotonic()
    try:
        async def burst() -> list[Reply]:
            async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
                return await asyncio.gather(*(ask(http, f"You answer in one word {i}.", i, 1) for i in range(4)))

        replies = asyncio.run(burst())
        out_s = wait_for(lambda: not replicas.replicas_up("prefix")["replica-0"], 5, "replica-0 out")
        print(f"\nreplica-0 out {time.monotonic() - stopped_s - out_s:.1f}s after SIGSTOP")
        assert {r.replica for r in replies} == {"replica-1"}
        retries = metric(httpx.get(base_url + "/metrics").text, "pagedserve_gateway_route_retries_total", "replica-0")
        assert retries >= retries_before + 1, "some request was routed to the hung replica and retried"
    finally:
        replicas.schedulers[0].signal(signal.SIGCONT)
    wait_for(lambda: replicas.replicas_up("prefix")["replica-0"], 15, "replica-0 back")


async def stream(http: httpx.AsyncClient, index: int, started: list[str]) -> tuple[str, str]:
    """(replica, how the stream ended: 'finished' or 'error'); every stream must end with [DONE]."""
    body = {"messages": [{"role": "user", "content": f"Count slowly from {index} to one hundred."}],
            "max_tokens": 48, "ignore_eos": True, "temperature": 0.0, "stream": True}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        replica = response.headers["x-pagedserve-replica"]
        started.append(replica)
        events = [line[len("data: "):] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    if "error" in last:
        return replica, "error"
    assert last["choices"][0]["finish_reason"] == "length"
    return replica, "finished"


def test_a_killed_worker_s_streams_resume_and_the_other_replica_serves_everything_new(replicas):
    base_url = replicas.base_url("prefix")
    wait_idle(replicas)

    async def run() -> tuple[list[tuple[str, str]], list[Reply]]:
        started: list[str] = []
        async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as http:
            streams = [asyncio.create_task(stream(http, i, started)) for i in range(8)]
            deadline_s = time.monotonic() + REQUEST_TIMEOUT_S
            while len(started) < 8 and time.monotonic() < deadline_s and not any(s.done() for s in streams):
                await asyncio.sleep(0.05)
            assert set(started) == set(REPLICA_IDS), f"both replicas should be streaming: {started}"
            replicas.workers[0].signal(signal.SIGKILL)
            ended = await asyncio.wait_for(asyncio.gather(*streams), 120)
            after = await asyncio.wait_for(asyncio.gather(*(ask(http, f"Say hello {i}.", i, 1) for i in range(6))),
                                           120)
        return ended, after

    resumed_before = metric(httpx.get(base_url + "/metrics").text, "pagedserve_requests_resumed_total",
                            "replica_failed", label="reason")
    ended, after = asyncio.run(run())
    assert {outcome for _, outcome in ended} == {"finished"}
    resumed = metric(httpx.get(base_url + "/metrics").text, "pagedserve_requests_resumed_total", "replica_failed",
                     label="reason")
    assert 1 <= resumed - resumed_before <= sum(replica == "replica-0" for replica, _ in ended)  # those it cut
    assert {reply.replica for reply in after} == {"replica-1"}
