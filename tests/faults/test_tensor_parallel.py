"""A tensor-parallel worker behind the real scheduler and gateway: the default model (9 heads, 3 KV heads) split
over 3 ranks (gloo on CPU), each rank its own process.

Through the services it answers 20 greedy requests exactly as the unsplit model does (an in-process TP = 1 engine
gives the reference), with prefix-cache hits and preemptions in a 16-block pool. A SIGKILL of one follower rank
mid-stream ends the open streams with an OpenAI error event and [DONE] and turns /health 503 within 10 s; a worker
started again as a supervisor would (same flags, same port) serves the reference answer and /health is 200.

fp32 weights, products and cache: a request's tokens do not depend on its batch, its preemptions or its cache hits,
so the TP = 3 stack and the TP = 1 engine, which batch differently, must agree token for token."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass

import httpx
import pytest
from transformers import AutoTokenizer

from pagedserve.benchmarks.engine.workloads import TOPICS
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.faults.clients import chat_body, join, start_streams
from tests.integration.processes import MODEL_DIR, process_alive, wait_for
from tests.support.fault_stack import FaultStack
from tests.unit.pagedserve.engine_runs import exact_worker, run

pytestmark = pytest.mark.slow  # about a minute and a half of CPU: two TP = 3 worker starts and the TP = 1 reference

NUM_REQUESTS = 20
KV_BLOCKS = 16  # of 16 tokens: a request needs at most 8 (3 of them the shared preamble's), all 20 about 100
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # fp32 keys and values of the default model: 30 layers, 3 KV heads of 64
TP_FLAGS = ("--tensor-parallel-size", "3", "--dtype", "float32", "--kv-cache-dtype", "float32",
            "--no-int8-activations", "--kv-cache-memory-bytes", str(KV_BLOCKS * 16 * KV_BYTES_PER_TOKEN),
            "--max-model-len", "128")
STARTUP_TIMEOUT_S = 300
WITHIN_S = 10.0  # the issue's bound from the kill to the streams' ends and to /health 503
PREAMBLE = ("You are the guide of a small natural history museum. Answer each visitor's question in two plain "
            "sentences, without lists or headings, and end with one surprising fact that a curious child would "
            "enjoy hearing about. Speak kindly, avoid jargon, and keep every answer short enough to read aloud.")


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str
    num_tokens: int
    num_cached: int = 0


def prompts(tokenizer) -> list[list[int]]:
    """The same 3-block preamble (prefix-cache hits), then a question: 68 to 74 tokens."""
    preamble = tokenizer.encode(PREAMBLE)
    assert len(preamble) >= 48, len(preamble)
    return [preamble + tokenizer.encode(f" Question {i}: what should I know about {TOPICS[i % len(TOPICS)]}?")
            for i in range(NUM_REQUESTS)]


def sampling(i: int) -> SamplingParams:
    """16 to 39 tokens; a third ignore EOS, so that both finish reasons occur."""
    return SamplingParams(temperature=0.0, max_tokens=16 + (i * 5) % 24, ignore_eos=i % 3 == 0)


def body(prompt: list[int], i: int) -> dict:
    params = sampling(i)
    return {"prompt": prompt, "max_tokens": params.max_tokens, "temperature": 0.0, "ignore_eos": params.ignore_eos}


def reference_answers(tokenizer, token_prompts: list[list[int]]) -> list[Answer]:
    """The unsplit model in process (TP = 1, the same exact numerics), text detokenized after the prompt."""
    requests = [GenerateRequest(f"r{i}", p, sampling(i)) for i, p in enumerate(token_prompts)]
    result = run(exact_worker(MODEL_DIR), requests, async_scheduling=False)
    answers = []
    for request in requests:
        tokens = result.tokens[request.req_id]
        head = tokenizer.decode(request.prompt_token_ids, skip_special_tokens=True)
        whole = tokenizer.decode(request.prompt_token_ids + tokens, skip_special_tokens=True)
        assert whole.startswith(head)
        answers.append(Answer(whole[len(head):], result.reasons[request.req_id].value, len(tokens)))
    return answers


@dataclass
class TensorParallelRun:
    stack: FaultStack
    prompts: list[list[int]]
    reference: list[Answer]


@pytest.fixture(scope="module")
def tp(tmp_path_factory) -> TensorParallelRun:
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAGEDSERVE_", "OTEL_"))}
    stack = FaultStack(tmp_path_factory.mktemp("tp"), env, worker_flags=TP_FLAGS)
    try:
        for service in stack.services:  # the ranks load while the reference runs here
            service.start()
        tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
        token_prompts = prompts(tokenizer)
        reference = reference_answers(tokenizer, token_prompts)
        stack.wait_health(200, STARTUP_TIMEOUT_S)
        stack.warm_up()
        yield TensorParallelRun(stack, token_prompts, reference)
    finally:
        stack.close()


def complete(stack: FaultStack, bodies: list[dict]) -> list[Answer]:
    """The bodies sent at once to /v1/completions; answers in order."""
    async def send_all() -> list[Answer]:
        async with httpx.AsyncClient(base_url=stack.http.base_url, timeout=300, trust_env=False) as client:
            return list(await asyncio.gather(*(_complete(client, b) for b in bodies)))

    return asyncio.run(send_all())


async def _complete(client: httpx.AsyncClient, body: dict) -> Answer:
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    reply = response.json()
    choice, usage = reply["choices"][0], reply["usage"]
    return Answer(choice["text"], choice["finish_reason"], usage["completion_tokens"],
                  usage["prompt_tokens_details"]["cached_tokens"])


def test_tp3_answers_twenty_greedy_requests_as_tp1(tp):
    stack, reference = tp.stack, tp.reference
    bodies = [body(p, i) for i, p in enumerate(tp.prompts)]
    before = stack.stats()
    first = complete(stack, bodies[:1])  # alone: its preamble blocks are cached for the others
    rest = complete(stack, bodies[1:])
    after = stack.stats()
    answers = first + rest
    strip = [Answer(a.text, a.finish_reason, a.num_tokens) for a in answers]
    assert strip == reference
    assert {a.finish_reason for a in answers} == {"stop", "length"}
    hits = [a.num_cached for a in rest]
    assert sum(h > 0 for h in hits) > 0, hits
    assert after.prefix_cache_hits > before.prefix_cache_hits
    assert after.num_preemptions > before.num_preemptions, "the 16-block pool preempted nothing"
    print(f"FIGURE TP=3 through the services: {NUM_REQUESTS} greedy answers equal TP=1's; "
          f"{sum(h > 0 for h in hits)} prefix-cache hits, {after.num_preemptions - before.num_preemptions} "
          "preemptions")
    stack.assert_quiescent_and_intact()


def follower_pids(stack: FaultStack) -> list[int]:
    """The follower ranks of the worker started last (its log says their pids)."""
    found = re.findall(r"followers pids \[([\d, ]+)\]", stack.worker.log_path.read_text(errors="replace"))
    assert found, stack.worker.log_tail()
    return [int(p) for p in found[-1].split(",")]


def test_killed_rank_fails_streams_and_health_and_a_restarted_worker_serves(tp):
    stack, reference = tp.stack, tp.reference
    stack.wait_health(200, 60)
    before = stack.integrity()
    ranks = follower_pids(stack)
    assert len(ranks) == 2
    threads, results = start_streams(stack, 3, chat_body("Tell me a long story about a dragon.", max_tokens=80,
                                                          ignore_eos=True))
    os.kill(ranks[-1], signal.SIGKILL)
    killed_s = time.monotonic()
    join(threads, 60)
    streams_ended_s = time.monotonic() - killed_s
    for result in results:  # tokens went out with a 200: the error comes as an event, then [DONE]
        assert result.status == 200 and result.done and result.text, result
        assert result.error is not None and result.error["type"] == "server_error", result
    unhealthy_s = stack.wait_health(503, WITHIN_S) + streams_ended_s
    print(f"FIGURE TP=3, kill -9 of rank 2: 3 streams ended {streams_ended_s:.2f}s, /health 503 "
          f"{unhealthy_s:.2f}s after the kill")
    assert streams_ended_s < WITHIN_S and unhealthy_s < WITHIN_S
    assert stack.worker.wait(WITHIN_S) != 0  # the whole worker went down with its rank
    wait_for(lambda: not any(process_alive(pid) for pid in ranks), 10, what="no rank of the old worker left")

    stack.restart_worker(timeout_s=STARTUP_TIMEOUT_S)  # as a supervisor would: same flags, same port
    assert stack.health() == 200
    assert stack.integrity().worker_incarnation_id != before.worker_incarnation_id
    assert set(follower_pids(stack)).isdisjoint(ranks)
    again = complete(stack, [body(tp.prompts[0], 0)])[0]
    assert Answer(again.text, again.finish_reason, again.num_tokens) == reference[0]
    stack.assert_quiescent_and_intact()

