"""Runs of the real scheduler and worker in process on SmolLM2, for tests that compare two runs' outputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import cast

import torch
from transformers import AutoTokenizer

from pagedserve.llm import chat_token_ids
from pagedserve.llm_engine import LLMEngine
from pagedserve.services.gpu_worker.kv_cache import kv_bytes_per_token
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import TokenLogprobs


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    reasons: dict[str, FinishReason] = field(default_factory=dict)
    logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)  # per output token
    num_preemptions: int = 0
    scheduler: Scheduler | None = None  # the run's scheduler, for its counters


def exact_worker(model_dir: Path, speculative_config: str = "") -> Worker:
    """fp32 products and cache: a request's numbers do not depend on its batch, so two runs must agree. With a
    draft model in `speculative_config` (no larger than the target) the budget doubles: at least 256 blocks."""
    model_config = load_model_config(model_dir)
    budget = 256 * 16 * kv_bytes_per_token(model_config, torch.float32) * (2 if speculative_config else 1)
    return Worker(WorkerConfig(model_dir=str(model_dir), dtype="float32", kv_cache_dtype="float32",
                               int8_activations=False, kv_cache_memory_bytes=budget,
                               speculative_config=speculative_config))


def chat_requests(model_dir: Path, contents: Sequence[str],
                  sampling: Callable[[int, tuple[int, ...]], SamplingParams]) -> list[GenerateRequest]:
    """One chat request a user message, r0, r1, ...; `sampling(i, stops)` gets the ids of ',' and '.'."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stops = tuple(tokenizer.convert_tokens_to_ids(t) for t in (",", "."))
    return [GenerateRequest(f"r{i}", chat_token_ids(tokenizer, [{"role": "user", "content": content}]),
                            sampling(i, cast(tuple[int, ...], stops))) for i, content in enumerate(contents)]


def mixed_stops(i: int, max_tokens: int, stops: tuple[int, ...]) -> SamplingParams:
    """Greedy; a third of the requests stop on `stops`, a quarter ignore EOS."""
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, stop_token_ids=stops if i % 3 == 0 else (),
                          ignore_eos=i % 4 == 1)


def roomy_run(worker: Worker, requests: list[GenerateRequest]) -> Run:
    """The serial reference in a pool that holds every request at once: nothing preempted."""
    reference = run(worker, requests, async_scheduling=False)
    assert reference.num_preemptions == 0
    return reference


def assert_same_outputs(got: Run, reference: Run, requests: list[GenerateRequest], aborts: dict[int, int]) -> None:
    """Every request got the reference's tokens and finish reason exactly, within its max_tokens; an aborted one
    (by index in `aborts`) a prefix of the reference's tokens."""
    for index, request in enumerate(requests):
        req_id = request.req_id
        if index in aborts:
            assert got.reasons[req_id] is FinishReason.ABORT
            assert got.tokens[req_id] == reference.tokens[req_id][:len(got.tokens[req_id])]
        else:
            assert (got.tokens[req_id], got.reasons[req_id]) == (reference.tokens[req_id], reference.reasons[req_id]), \
                req_id
            assert len(got.tokens[req_id]) <= request.sampling.max_tokens


def differing_requests(a: Run, b: Run, requests: list[GenerateRequest]) -> list[str]:
    """The requests whose tokens or finish reason differ between two runs."""
    return [r.req_id for r in requests if (a.tokens[r.req_id], a.reasons[r.req_id]) != (b.tokens[r.req_id],
                                                                                          b.reasons[r.req_id])]


def assert_seeded_speculation_exact(worker: Worker, requests: list[GenerateRequest], speculative_config: str,
                                    min_accepted: int) -> None:
    """Seeded requests with speculation give the same tokens run to run (serial; async, reversed, two at a time)
    and the same as without speculation, with more than `min_accepted` drafts accepted in each speculating run."""
    plain = run(worker, requests, async_scheduling=False)
    first = run(worker, requests, async_scheduling=False, speculative_config=speculative_config)
    second = run(worker, requests[::-1], async_scheduling=True, speculative_config=speculative_config,
                 max_num_seqs=2)
    for spec in (first, second):
        assert spec.scheduler.drafts.counters.num_accepted_tokens > min_accepted
    assert differing_requests(first, second, requests) == []  # run to run, other batches and order
    assert differing_requests(first, plain, requests) == []  # and what the request draws without speculation


def batch_invariant_worker(model_dir: Path, num_blocks: int = 256) -> Worker:
    """The serving defaults (dtype auto, KV cache dtype auto, C kernels) with --batch-invariant: a request's numbers
    do not depend on its batch, chunking or preemption."""
    model_config = load_model_config(model_dir)
    platform = CpuPlatform.from_config(WorkerConfig(model_dir=str(model_dir)))
    kv_dtype = platform.kv_cache_dtype("auto", platform.serving_dtype(model_config.dtype, str(model_dir)))
    return Worker(WorkerConfig(model_dir=str(model_dir), batch_invariant=True,
                               kv_cache_memory_bytes=num_blocks * 16 * kv_bytes_per_token(model_config, kv_dtype)))


def run(worker: Worker, requests: list[GenerateRequest], async_scheduling: bool, num_blocks: int | None = None,
        aborts: dict[int, int] | None = None, speculative_config: str = "", max_num_seqs: int | None = None,
        enable_prefix_caching: bool = True) -> Run:
    """Every request to its end (`aborts`: request index -> the engine step that aborts it); then no mirror or
    matcher is left on the worker and every KV block is free."""
    config = SchedulerConfig(max_num_batched_tokens=256, speculative_config=speculative_config,
                             enable_prefix_caching=enable_prefix_caching)
    if max_num_seqs is not None:
        config = replace(config, max_num_seqs=max_num_seqs)
    engine = LLMEngine(worker, config, async_scheduling)
    if num_blocks is not None:  # the scheduler hands out only the first num_blocks of the worker's pool
        engine.scheduler = Scheduler(engine.scheduler.config, replace(engine.description, num_kv_blocks=num_blocks))
    result = Run()
    for request in requests:
        engine.add_request(request)
        result.tokens[request.req_id] = []
        result.logprobs[request.req_id] = []
    num_steps = 0
    while engine.has_unfinished_requests():
        for index, step in (aborts or {}).items():
            if step == num_steps and engine.abort_request(requests[index].req_id):
                result.reasons[requests[index].req_id] = FinishReason.ABORT
        for out in engine.step():
            assert out.req_id not in result.reasons, f"{out.req_id} streamed after it finished"
            result.tokens[out.req_id].extend(out.new_token_ids)
            result.logprobs[out.req_id].extend(out.new_logprobs)
            if out.finished:
                result.reasons[out.req_id] = out.finish_reason
        num_steps += 1
    while engine.scheduler.finished_req_ids:  # tell the worker about the last finishes
        engine.step()
    assert engine.worker.requests == {}  # no mirror (and no matcher) left behind
    engine.scheduler.kv.check_integrity()
    assert engine.scheduler.kv.usage == 0.0
    result.num_preemptions = engine.scheduler.snapshot_stats().num_preemptions
    result.scheduler = engine.scheduler
    return result
