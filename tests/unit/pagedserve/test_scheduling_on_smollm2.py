"""The real scheduler driving the real engine on SmolLM2: batching, preemption, chunking and prefix caching must
not change greedy outputs, and the prefix cache must save the shared prompt's compute."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pagedserve.benchmarks.engine.workloads import POLICY_QUESTIONS, policy_system_prompt, varied_questions
from pagedserve.llm import LLM, Completion, chat_token_ids
from pagedserve.services.gpu_worker.kv_cache import kv_bytes_per_token
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.sampling_params import SamplingParams
from tests.greedy_match import check_greedy_match

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, logprobs=5)
NUM_REQUESTS = 24


def make_llm(model_dir, num_blocks: int = 2048, **scheduler) -> LLM:
    budget = num_blocks * 16 * kv_bytes_per_token(load_model_config(model_dir))
    config = WorkerConfig(model_dir=str(model_dir), dtype="float32", kv_cache_memory_bytes=budget)  # exact compares
    return LLM(config, SchedulerConfig(**scheduler))


@pytest.fixture(scope="module")
def prompts(smollm2_dir):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return [chat_token_ids(tokenizer, [{"role": "user", "content": q}]) for q in varied_questions(NUM_REQUESTS)]


@pytest.fixture(scope="module")
def one_at_a_time(smollm2_dir, prompts) -> list[Completion]:
    llm = make_llm(smollm2_dir)
    return [llm.generate([p], GREEDY)[0] for p in prompts]


def assert_same_outputs(reference: list[Completion], other: list[Completion], label: str) -> None:
    verdicts = []
    for ref, out in zip(reference, other, strict=True):
        top_ref = [lp.top_token_ids for lp in ref.logprobs]
        top_out = [lp.top_token_ids for lp in out.logprobs]
        verdicts.append(check_greedy_match(ref.token_ids, top_ref, out.token_ids, top_out).describe())
    flips = [v for v in verdicts if v != "exact"]
    print(f"{label}: {len(verdicts) - len(flips)} exact, near-tie flips: {flips}")


def test_all_at_once_with_a_large_pool(smollm2_dir, prompts, one_at_a_time):
    llm = make_llm(smollm2_dir, max_num_batched_tokens=2048)
    outputs = llm.generate(prompts, GREEDY)
    assert_same_outputs(one_at_a_time, outputs, "all at once")
    assert llm.engine.scheduler.snapshot_stats().num_preemptions == 0
    llm.engine.scheduler.kv.check_integrity()


def test_all_at_once_with_preemptions(smollm2_dir, prompts, one_at_a_time):
    longest = max(len(p) for p in prompts) + GREEDY.max_tokens
    llm = make_llm(smollm2_dir, num_blocks=-(-longest // 16) + 6, max_num_batched_tokens=512)
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.engine.scheduler.snapshot_stats()
    assert stats.num_preemptions > 0
    print(f"preemptions: {stats.num_preemptions}")
    assert_same_outputs(one_at_a_time, outputs, "small pool")
    assert stats.kv_usage == 0.0
    llm.engine.scheduler.kv.check_integrity()


def test_token_budget_64_chunks_every_long_prompt(smollm2_dir, prompts, one_at_a_time):
    llm = make_llm(smollm2_dir, max_num_batched_tokens=64)
    assert sum(len(p) > 64 for p in prompts) >= 8
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.engine.scheduler.snapshot_stats()
    assert stats.num_steps >= sum(len(p) for p in prompts) // 64  # the prompts alone need that many steps
    assert_same_outputs(one_at_a_time, outputs, "budget 64")
    llm.engine.scheduler.kv.check_integrity()


def _policy_run(smollm2_dir, enable_prefix_caching: bool) -> tuple[list[Completion], float]:
    """One warm-up request, then 12 sharing its ~1,000-token system prompt; the share of their prompt tokens
    that had to be computed, from the tokens the scheduler actually scheduled."""
    llm = make_llm(smollm2_dir, enable_prefix_caching=enable_prefix_caching)
    system = policy_system_prompt()
    llm.generate([llm.chat_prompt("Hello", system)], GREEDY)
    before = llm.engine.scheduler.snapshot_stats()
    batch = [llm.chat_prompt(q, system) for q in POLICY_QUESTIONS]
    assert min(len(p) for p in batch) > 1000
    outputs = llm.generate(batch, GREEDY)
    after = llm.engine.scheduler.snapshot_stats()
    num_prompt_tokens = sum(len(p) for p in batch)
    # every scheduled token is a prompt token or a fed-back output (all outputs but each request's last)
    num_decode_inputs = sum(len(c.token_ids) - 1 for c in outputs)
    computed = after.num_scheduled_tokens_total - before.num_scheduled_tokens_total - num_decode_inputs
    if enable_prefix_caching:  # the counters tell the same story
        assert after.prefix_cache_queries - before.prefix_cache_queries == num_prompt_tokens
        assert num_prompt_tokens - (after.prefix_cache_hits - before.prefix_cache_hits) == computed
    llm.engine.scheduler.kv.check_integrity()
    return outputs, computed / num_prompt_tokens


def test_prefix_cache_saves_the_shared_prompt(smollm2_dir):
    cached_outputs, computed_share = _policy_run(smollm2_dir, enable_prefix_caching=True)
    print(f"prompt tokens computed with the cache: {computed_share:.1%}")
    assert computed_share <= 0.15
    uncached_outputs, uncached_share = _policy_run(smollm2_dir, enable_prefix_caching=False)
    assert uncached_share == 1.0
    assert all(c.num_cached_tokens >= 1000 for c in cached_outputs)
    assert_same_outputs(uncached_outputs, cached_outputs, "prefix cache on vs off")
