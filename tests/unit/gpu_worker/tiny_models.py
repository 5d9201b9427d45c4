"""Tiny random-weight models built from transformers' config classes, saved as Hugging Face folders."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.input_batch import build_model_input
from pagedserve.services.gpu_worker.kv_cache import KVCache
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig, load_model_config
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from pagedserve.services.gpu_worker.platforms.platform import Platform
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.sampling_params import SamplingParams

_COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
               num_key_value_heads=2, max_position_embeddings=256)

TINY_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**_COMMON, tie_word_embeddings=True),
    "llama3-rope": lambda: transformers.LlamaConfig(
        **{**_COMMON, "num_key_value_heads": 8}, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "qwen2": lambda: transformers.Qwen2Config(**_COMMON, tie_word_embeddings=False),
    "mistral": lambda: transformers.MistralConfig(**{**_COMMON, "num_key_value_heads": 1}, sliding_window=24),
    "qwen3": lambda: transformers.Qwen3Config(**_COMMON, head_dim=16),
}

_MODEL_CLASSES = {"llama": transformers.LlamaForCausalLM, "llama3-rope": transformers.LlamaForCausalLM,
                  "qwen2": transformers.Qwen2ForCausalLM, "mistral": transformers.MistralForCausalLM,
                  "qwen3": transformers.Qwen3ForCausalLM}


def make_tiny_model(name: str, folder: Path, seed: int = 0) -> torch.nn.Module:
    """Save a random-weight model to `folder`; return transformers' own (eager, fp32) implementation of it."""
    torch.manual_seed(seed)
    config = TINY_CONFIGS[name]()
    config._attn_implementation = "eager"
    model = _MODEL_CLASSES[name](config).eval()
    with torch.no_grad():  # random biases, so that a missing bias cannot go unnoticed
        for module_name, param in model.named_parameters():
            if module_name.endswith("bias"):
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    return model


class PagedModel:
    """Our DecoderLM over a small paged KV cache, with a trivial block allocator for tests.

    `backend`: "torch" (torch only), "torch+native" (with the C kernels of kernels/cpu), "triton" (on a CUDA
    machine compiled on the GPU, else through Triton's interpreter on CPU) or "triton+cuda-layers" (the CUDA
    platform's bindings, its fused layer kernels included, interpreted on a CPU-only machine); `platform`
    overrides the CPU one; `kv_dtype` the cache's (default: the model's)."""

    def __init__(self, folder: Path, block_size: int = 4, num_blocks: int = 256, backend: str = "torch",
                 dtype: str = "float32", platform: Platform | None = None,
                 kv_dtype: torch.dtype | None = None) -> None:
        self.config: ModelConfig = load_model_config(folder, dtype)
        c = self.config
        shape = AttentionShape(c.num_heads, c.num_kv_heads, c.head_dim, c.head_dim ** -0.5, c.sliding_window)
        if platform is None and backend.startswith("triton") and torch.cuda.is_available():
            platform = CudaPlatform(torch.device("cuda"))
        elif platform is None and backend == "triton+cuda-layers":
            platform = CudaPlatform(torch.device("cpu"))
        self.platform = platform or CpuPlatform(native_kernels=backend == "torch+native", torch_compile=False)
        self.device = self.platform.device
        attention = self.platform.attention_backend(backend.split("+")[0], shape, c.dtype, kv_dtype or c.dtype,
                                                    block_size)
        self.model: DecoderLM = load_model(folder, c, attention, 256, self.platform)
        self.kv = KVCache.allocate(c, num_blocks, block_size, self.device, kv_dtype)
        self.forward = self.platform.model_forward(self.model, attention, self.kv)
        self.block_size = block_size
        self.next_block = 0

    def new_request(self, req_id: str, token_ids: list[int], shared_blocks: list[int] = ()) -> RequestState:
        state = RequestState(req_id, list(token_ids), len(token_ids), SamplingParams(temperature=0.0), [], 0, ())
        state.block_ids.extend(shared_blocks)
        state.num_computed_tokens = len(shared_blocks) * self.block_size
        return state

    def _ensure_blocks(self, state: RequestState, num_tokens: int) -> None:
        while len(state.block_ids) * self.block_size < num_tokens:
            state.block_ids.append(self.next_block)
            self.next_block += 1

    @torch.inference_mode()
    def step(self, scheduled: list[tuple[RequestState, int]]) -> dict[str, torch.Tensor]:
        """Compute the given number of next tokens of each request in one forward; logits of every computed row."""
        for state, n in scheduled:
            self._ensure_blocks(state, state.num_computed_tokens + n)
        batch = build_model_input([s for s, _ in scheduled], [n for _, n in scheduled], self.block_size,
                                  self.device)
        hidden = self.forward(batch.token_ids, batch.positions, self.kv.layers, batch.meta, None)
        logits = self.model.compute_logits(hidden, batch.meta.rows)
        starts = batch.meta.query_start_loc_cpu
        out = {}
        for i, (state, n) in enumerate(zip(batch.requests, batch.num_scheduled, strict=True)):
            out[state.req_id] = logits[starts[i]: starts[i + 1]].cpu()
            state.num_computed_tokens += n
        return out
