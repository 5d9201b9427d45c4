"""KV pool sizing from a byte budget (the seed's formula) and the cache layout."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.kv_cache import KVCache, kv_bytes_per_token, num_blocks_for_budget
from pagedserve.services.gpu_worker.model_config import model_config_from_dict
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform

SMOLLM2_LIKE = {"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
                "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "head_dim": 64}


def test_bytes_per_token_follow_the_formula():
    config = model_config_from_dict(SMOLLM2_LIKE)
    assert kv_bytes_per_token(config) == 2 * 30 * 3 * 64 * 4  # K and V x layers x KV heads x head dim x fp32
    assert kv_bytes_per_token(model_config_from_dict(SMOLLM2_LIKE, "bfloat16")) == 2 * 30 * 3 * 64 * 2


def test_blocks_from_budget_and_allocated_bytes_fit_it():
    config = model_config_from_dict(SMOLLM2_LIKE)
    budget = 64 * 1024**2
    num_blocks = num_blocks_for_budget(config, budget, block_size=16)
    assert num_blocks == budget // (46080 * 16) == 91
    cache = KVCache.allocate(config, num_blocks, 16, torch.device("cpu"))
    assert cache.key_caches[0].shape == (91, 16, 3, 64)
    assert len(cache.layers) == 30
    assert cache.num_bytes <= budget


def test_budget_below_one_block_is_an_error():
    config = model_config_from_dict(SMOLLM2_LIKE)
    with pytest.raises(ValueError, match="kv-cache-memory"):
        KVCache.allocate(config, num_blocks_for_budget(config, 1000, 16), 16, torch.device("cpu"))


def test_an_fp16_cache_holds_twice_the_tokens() -> None:
    config = model_config_from_dict(SMOLLM2_LIKE, "float32")
    assert kv_bytes_per_token(config, torch.float16) == kv_bytes_per_token(config) // 2
    budget = 64 * 1024**2
    blocks = num_blocks_for_budget(config, budget, 16, torch.float16)
    assert blocks == 2 * num_blocks_for_budget(config, budget, 16)
    cache = KVCache.allocate(config, blocks, 16, torch.device("cpu"), torch.float16)
    assert cache.dtype == torch.float16 and cache.num_bytes <= budget


def test_an_fp8_cache_holds_twice_the_blocks_of_fp16() -> None:
    """`--kv-cache-dtype fp8` under a bf16 model: 1 byte an element, so the same budget gives twice fp16's blocks."""
    config = model_config_from_dict(SMOLLM2_LIKE, "bfloat16")
    cuda = CudaPlatform(torch.device("cuda"))  # touches no device
    fp8 = cuda.kv_cache_dtype("fp8", config.dtype)
    assert fp8 == cuda.kv_cache_dtype("fp8_e4m3", config.dtype) == torch.float8_e4m3fn
    assert kv_bytes_per_token(config, fp8) == 2 * 30 * 3 * 64 * 1
    budget = 64 * 1024**2
    fp16_blocks = num_blocks_for_budget(config, budget, 16, torch.float16)
    fp8_blocks = num_blocks_for_budget(config, budget, 16, fp8)
    assert (fp16_blocks, fp8_blocks) == (182, 364)
    cache = KVCache.allocate(config, fp8_blocks, 16, torch.device("cpu"), fp8)
    assert cache.dtype == torch.float8_e4m3fn and cache.num_bytes <= budget
    assert cache.num_bytes == KVCache.allocate(config, fp16_blocks, 16, torch.device("cpu"), torch.float16).num_bytes
