"""Batch-invariant mode (`--batch-invariant`), in the serving default dtype of this CPU: a greedy answer depends
only on its own prompt. 20 concurrent greedy requests of 80 tokens (ignore_eos) give the same tokens, all 20 of
them, on a tiny KV pool where preemptions make requests recompute their KV as prompt chunks as on a large pool
where none is preempted; and on the large pool again with other step compositions (prompts chunked at 64 tokens,
5 requests at a time, in reverse order)."""

from __future__ import annotations

import pytest

from pagedserve.benchmarks.engine.workloads import varied_questions
from pagedserve.llm import LLM, Completion, chat_token_ids
from pagedserve.services.gpu_worker.kv_cache import kv_bytes_per_token
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(2400)  # three runs of 20 x 80 tokens: minutes on a loaded 2-core machine
NUM_REQUESTS = 20
GREEDY = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)


def make_llm(model_dir, num_blocks: int, **scheduler) -> LLM:
    """The serving defaults (dtype auto, KV cache dtype auto, C kernels) in batch-invariant mode."""
    config = load_model_config(model_dir)
    platform = CpuPlatform.from_config(WorkerConfig(model_dir=str(model_dir)))
    kv_dtype = platform.kv_cache_dtype("auto", platform.serving_dtype(config.dtype, str(model_dir)))
    budget = num_blocks * 16 * kv_bytes_per_token(config, kv_dtype)
    worker = WorkerConfig(model_dir=str(model_dir), kv_cache_memory_bytes=budget, batch_invariant=True)
    return LLM(worker, SchedulerConfig(**scheduler))


@pytest.fixture(scope="module")
def prompts(smollm2_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return [chat_token_ids(tokenizer, [{"role": "user", "content": q}]) for q in varied_questions(NUM_REQUESTS)]


@pytest.fixture(scope="module")
def large_pool(smollm2_dir, prompts) -> list[Completion]:
    llm = make_llm(smollm2_dir, num_blocks=2048)
    outputs = llm.generate(prompts, GREEDY)
    assert llm.engine.scheduler.snapshot_stats().num_preemptions == 0
    return outputs


def _differing(reference: list[Completion], other: list[Completion]) -> list[int]:
    assert all(len(c.token_ids) == GREEDY.max_tokens for c in [*reference, *other])
    return [i for i, (a, b) in enumerate(zip(reference, other, strict=True)) if a.token_ids != b.token_ids]


def test_preemption_never_changes_a_greedy_answer(smollm2_dir, prompts, large_pool) -> None:
    longest = max(len(p) for p in prompts) + GREEDY.max_tokens
    llm = make_llm(smollm2_dir, num_blocks=-(-longest // 16) + 6)
    outputs = llm.generate(prompts, GREEDY)
    stats = llm.engine.scheduler.snapshot_stats()
    print(f"tiny pool: {stats.num_preemptions} preemptions")
    assert stats.num_preemptions >= 10
    assert _differing(large_pool, outputs) == []
    llm.engine.scheduler.kv.check_integrity()


def test_other_step_compositions_give_the_same_answers(smollm2_dir, prompts, large_pool) -> None:
    llm = make_llm(smollm2_dir, num_blocks=2048, max_num_batched_tokens=64, max_num_seqs=5)
    outputs = llm.generate(prompts[::-1], GREEDY)[::-1]
    assert llm.engine.scheduler.snapshot_stats().num_preemptions == 0
    assert _differing(large_pool, outputs) == []
