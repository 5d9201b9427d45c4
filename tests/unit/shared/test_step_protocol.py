"""ModelDescription.pool_problem: a KV pool that cannot hold one request of the full context is named at start."""

from __future__ import annotations

from pagedserve.shared.step_protocol import ModelDescription


def description(num_kv_blocks: int, max_model_len: int = 256) -> ModelDescription:
    return ModelDescription(model_name="m", architecture="LlamaForCausalLM", max_model_len=max_model_len,
                            vocab_size=100, num_kv_blocks=num_kv_blocks, block_size=16, eos_token_ids=(2,),
                            dtype="float32", device="cpu", attention_backend="torch",
                            kv_cache_bytes=num_kv_blocks * 2**20)


def test_a_pool_that_holds_the_full_context_has_no_problem():
    assert description(16).pool_problem() is None  # 16 x 16 = 256 tokens
    assert description(100).pool_problem() is None


def test_a_pool_smaller_than_the_context_says_how_much_memory_it_needs():
    problem = description(4).pool_problem()  # 64 tokens of 256
    assert problem is not None
    assert "holds 64 tokens, fewer than the context limit of 256" in problem
    assert "at least 16 MiB" in problem and "--kv-cache-memory-bytes" in problem and "--max-model-len" in problem
