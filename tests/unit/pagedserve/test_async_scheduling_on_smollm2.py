"""Async scheduling on the real model: the same greedy outputs as the serial loop, stops and aborts exact, and
preemption in a tiny pool, through the real scheduler and worker (in process, one step in flight)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
import torch
from transformers import AutoTokenizer

from benchmarks.engine.workloads import TOPICS
from pagedserve.llm import chat_token_ids
from pagedserve.llm_engine import LLMEngine
from services.gpu_worker.kv_cache import kv_bytes_per_token
from services.gpu_worker.model_config import load_model_config
from services.gpu_worker.worker import Worker
from services.gpu_worker.worker_config import WorkerConfig
from services.scheduler.scheduler import Scheduler
from services.scheduler.scheduler_config import SchedulerConfig
from shared.request_io import FinishReason, GenerateRequest
from shared.sampling_params import SamplingParams

NUM_REQUESTS = 24
ABORTS = {3: 6, 10: 9, 17: 14}  # request index -> engine step at which it is aborted
TINY_POOL = 12  # blocks of 16 tokens, a fraction of what the 24 requests would hold at once: requests preempt


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    reasons: dict[str, FinishReason] = field(default_factory=dict)
    num_preemptions: int = 0


@pytest.fixture(scope="module")
def worker(smollm2_dir) -> Worker:
    """fp32 products and cache: a request's numbers do not depend on its batch, so the two loops must agree."""
    model_config = load_model_config(smollm2_dir)
    return Worker(WorkerConfig(model_dir=str(smollm2_dir), dtype="float32", kv_cache_dtype="float32",
                               int8_activations=False, kv_cache_memory_bytes=256 * 16 * kv_bytes_per_token(
                                   model_config, torch.float32)))


@pytest.fixture(scope="module")
def requests(smollm2_dir) -> list[GenerateRequest]:
    """Prompts of about 30 to 110 tokens, answers of 6 to 31; a third stop on a token id (',' or '.'), a quarter
    ignore EOS."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    stops = tuple(tokenizer.convert_tokens_to_ids(t) for t in (",", "."))
    out = []
    for i in range(NUM_REQUESTS):
        topic = TOPICS[i % len(TOPICS)]
        notes = " ".join(f"Note {k}: {topic} comes up in chapter {k}." for k in range(i % 7))
        prompt = chat_token_ids(tokenizer, [{"role": "user", "content": f"{notes} What is {topic}?"}])
        sampling = SamplingParams(temperature=0.0, max_tokens=6 + (i * 7) % 26,
                                  stop_token_ids=stops if i % 3 == 0 else (), ignore_eos=i % 4 == 1)
        out.append(GenerateRequest(f"r{i}", prompt, sampling))
    return out


def run(worker: Worker, requests: list[GenerateRequest], async_scheduling: bool, num_blocks: int | None = None,
        aborts: dict[int, int] | None = None) -> Run:
    engine = LLMEngine(worker, SchedulerConfig(max_num_batched_tokens=256), async_scheduling)
    if num_blocks is not None:  # the scheduler hands out only the first num_blocks of the worker's pool
        engine.scheduler = Scheduler(engine.scheduler.config, replace(engine.description, num_kv_blocks=num_blocks))
    result = Run()
    for request in requests:
        engine.add_request(request)
        result.tokens[request.req_id] = []
    num_steps = 0
    while engine.has_unfinished_requests():
        for index, step in (aborts or {}).items():
            if step == num_steps and engine.abort_request(requests[index].req_id):
                result.reasons[requests[index].req_id] = FinishReason.ABORT
        for out in engine.step():
            assert out.req_id not in result.reasons, f"{out.req_id} streamed after it finished"
            result.tokens[out.req_id].extend(out.new_token_ids)
            if out.finished:
                result.reasons[out.req_id] = out.finish_reason
        num_steps += 1
    while engine.scheduler.finished_req_ids:  # tell the worker about the last finishes
        engine.step()
    assert engine.worker.requests == {}  # no mirror left behind
    engine.scheduler.kv.check_integrity()
    assert engine.scheduler.kv.usage == 0.0
    result.num_preemptions = engine.scheduler.snapshot_stats().num_preemptions
    return result


@pytest.fixture(scope="module")
def serial(worker, requests) -> Run:
    reference = run(worker, requests, async_scheduling=False)
    assert reference.num_preemptions == 0
    return reference


def test_async_gives_the_serial_loops_greedy_outputs_with_aborts_and_preemptions(worker, requests, serial):
    """The reference runs serially in a pool that holds everything; the async run preempts in a tiny one and aborts
    three requests mid-stream: every other request gets the reference's tokens and finish reason exactly, and an
    aborted one a prefix of its reference."""
    assert FinishReason.STOP in serial.reasons.values() and FinishReason.LENGTH in serial.reasons.values()
    tiny = run(worker, requests, async_scheduling=True, num_blocks=TINY_POOL, aborts=ABORTS)
    assert tiny.num_preemptions > 0
    for index, request in enumerate(requests):
        req_id = request.req_id
        if index in ABORTS:
            assert tiny.reasons[req_id] is FinishReason.ABORT
            assert tiny.tokens[req_id] == serial.tokens[req_id][:len(tiny.tokens[req_id])]
        else:
            assert (tiny.tokens[req_id], tiny.reasons[req_id]) == (serial.tokens[req_id], serial.reasons[req_id])
