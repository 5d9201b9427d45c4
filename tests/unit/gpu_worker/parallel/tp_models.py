"""Tiny random models whose heads split over 2 and 3 ranks (6 query heads; 6 KV heads shard, 1 replicates, 3
shards over 3 ranks only), and a driver that runs prompt + decode steps through the paged KV path on one rank."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.sampling_params import SamplingParams

_COMMON = dict(vocab_size=101, hidden_size=96, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
               max_position_embeddings=256)
TP_MODELS = {
    "llama": lambda: transformers.LlamaConfig(**_COMMON, num_key_value_heads=6, tie_word_embeddings=True,
                                              attention_bias=True, mlp_bias=True),
    "qwen2": lambda: transformers.Qwen2Config(**_COMMON, num_key_value_heads=1, tie_word_embeddings=False),
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, num_key_value_heads=6, head_dim=16),
    "mistral": lambda: transformers.MistralConfig(**_COMMON, num_key_value_heads=1, sliding_window=24),
    "llama-3kv": lambda: transformers.LlamaConfig(**_COMMON, num_key_value_heads=3),
}
_CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "qwen3": transformers.Qwen3ForCausalLM, "mistral": transformers.MistralForCausalLM,
            "llama-3kv": transformers.LlamaForCausalLM}
BLOCK_SIZE = 4
# (request, tokens) per step: A's 7-token prompt at once, B's 6-token prompt in two chunks, then decodes
PROMPTS = {"a": [5, 17, 99, 3, 42, 64, 8], "b": [11, 23, 100, 0, 77, 50]}
STEPS = [[("a", 7), ("b", 3)], [("b", 3), ("a", 1)], [("a", 1), ("b", 1)], [("a", 1), ("b", 1)]]
DECODE_TOKENS = [13, 88, 2, 61, 34]  # fed as each request's next tokens (teacher forcing: every rank agrees)


def make_tp_model(name: str, folder: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    model = _CLASSES[name](TP_MODELS[name]()).eval()
    with torch.no_grad():  # random biases and norms, so that a bias added twice or a norm sliced cannot hide
        for param_name, param in model.named_parameters():
            if param_name.endswith("bias") or "norm" in param_name:
                param.normal_(0.5, 0.5)
    model.save_pretrained(folder)


def tiny_config(folder: Path, tp: int = 1) -> WorkerConfig:
    return WorkerConfig(model_dir=str(folder), dtype="float32", kv_cache_dtype="float32", block_size=BLOCK_SIZE,
                        kv_cache_memory_bytes=1 << 20, torch_compile=False, native_kernels=False, num_threads=1,
                        tensor_parallel_size=tp, max_model_len=128)


@torch.inference_mode()
def run_steps(folder: Path, tp: TensorParallelGroup | None) -> list[torch.Tensor | None]:
    """The logits of the sampling rows of each step of STEPS (None on ranks other than 0)."""
    runner = ModelRunner(tiny_config(folder, 1 if tp is None else tp.world_size), tp)
    requests = {req_id: RequestState(req_id, list(tokens), len(tokens), SamplingParams(temperature=0.0),
                                     [], 0, ()) for req_id, tokens in PROMPTS.items()}
    next_block, out = 0, []
    for i, step in enumerate(STEPS):
        for req_id, n in step:
            state = requests[req_id]
            if state.num_computed_tokens + n > len(state.token_ids):
                state.token_ids.append(DECODE_TOKENS[i])
            while len(state.block_ids) * BLOCK_SIZE < state.num_computed_tokens + n:
                state.block_ids.append(next_block)
                next_block += 1
        states, counts = [requests[r] for r, _ in step], [n for _, n in step]
        logits, _ = runner._logits(states, counts, i)
        out.append(None if logits is None else logits.clone())
        for state, n in zip(states, counts, strict=True):
            state.num_computed_tokens += n
    return out
