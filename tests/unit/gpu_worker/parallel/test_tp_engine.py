"""The engine through a tensor-parallel worker: on SmolLM2 (9 heads, 3 KV heads) TP = 3 answers greedy requests
exactly as TP = 1, under async scheduling, with prefix-cache hits and preemption in a small pool; TP = 2 is
refused before any process starts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from pagedserve.llm import chat_token_ids
from pagedserve.services.gpu_worker.kv_cache import kv_bytes_per_token
from pagedserve.services.gpu_worker.model_config import UnsupportedModelError, load_model_config
from pagedserve.services.gpu_worker.parallel.launch import build_worker
from pagedserve.services.gpu_worker.parallel.leader import TensorParallelLeader
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.pagedserve.engine_runs import run

NUM_REQUESTS = 6
SMALL_POOL = 7  # blocks of 16 tokens: the longest request alone fits (83 tokens), all at once do not: preemption


def _config(model_dir, tp: int) -> WorkerConfig:
    model_config = load_model_config(model_dir)
    return WorkerConfig(model_dir=str(model_dir), dtype="float32", kv_cache_dtype="float32", int8_activations=False,
                        torch_compile=False, tensor_parallel_size=tp, num_threads=1,
                        kv_cache_memory_bytes=64 * 16 * kv_bytes_per_token(model_config, torch.float32))


def _requests(model_dir) -> list[GenerateRequest]:
    """A shared 40-odd-token preamble (prefix-cache hits for the later requests), answers of 8 to 20 tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    preamble = "You answer in one short sentence. Be precise and factual, and do not repeat the question."
    topics = ["rivers", "the moon", "bread", "glaciers", "violins", "copper"]
    return [GenerateRequest(f"r{i}", chat_token_ids(tokenizer, [{"role": "system", "content": preamble},
                                                                {"role": "user", "content": f"What is {t}?"}]),
                            SamplingParams(temperature=0.0, max_tokens=8 + 3 * i, ignore_eos=i % 2 == 1))
            for i, t in enumerate(topics[:NUM_REQUESTS])]


def test_tp3_answers_greedy_requests_as_tp1(smollm2_dir):
    requests = _requests(smollm2_dir)
    single = build_worker(_config(smollm2_dir, 1))
    reference = run(single, requests, async_scheduling=True)
    del single
    leader = build_worker(_config(smollm2_dir, 3))
    assert isinstance(leader, TensorParallelLeader)
    try:
        assert leader.describe().num_kv_blocks == 64  # each rank: a third of the budget for a third of the heads
        parallel = run(leader, requests, async_scheduling=True, num_blocks=SMALL_POOL)
    finally:
        leader.close()
    assert parallel.tokens == reference.tokens
    assert parallel.reasons == reference.reasons
    assert parallel.num_preemptions > 0
    assert all(len(tokens) >= 8 for tokens in parallel.tokens.values())


def test_tp2_is_refused_on_nine_heads(smollm2_dir):
    with pytest.raises(UnsupportedModelError, match="9 attention heads"):
        build_worker(_config(smollm2_dir, 2))
