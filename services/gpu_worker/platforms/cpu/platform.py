"""The CPU platform: bf16 where the CPU is fast at it, the C kernels of kernels/cpu where they build, torch (or
torch.compile) where they do not, and an opt-in batch-invariant mode."""

from __future__ import annotations

import torch

from pagedserve.kernels.cpu.packed_linear import PackedWeight
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import FP8_KV_NAMES, KVCache, fp8_kv_refusal
from pagedserve.services.gpu_worker.layers.grid_embedding import GridEmbedding
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import parse_dtype
from pagedserve.services.gpu_worker.platforms.cpu import attention
from pagedserve.services.gpu_worker.platforms.cpu.cpu_flags import cpu_has_fast_bf16
from pagedserve.services.gpu_worker.platforms.cpu.elementwise import bind_fused_ops
from pagedserve.services.gpu_worker.platforms.cpu.grid_checkpoint import has_4bit_grid_weights
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear, LinearOptions, bind_linears
from pagedserve.services.gpu_worker.platforms.cpu.native import NativeKernels
from pagedserve.services.gpu_worker.platforms.cpu.one_call_decode import build_one_call_decode
from pagedserve.services.gpu_worker.platforms.platform import ModelForward, Platform
from pagedserve.services.gpu_worker.quantized.scheme import has_int4_scheme
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.gguf_folder import find_gguf


class CpuPlatform(Platform):
    """The flags keep the worker's names: `native_kernels` (the C kernels), `torch_compile` (compiled fallbacks),
    `int8_activations` (fp32: 4-bit grid weights multiply int8 inputs), `batch_invariant` (a request's numbers
    depend only on its own tokens: not on what shares its steps, how its prompt is chunked, or preemption)."""

    name = "cpu"
    default_attention_backend = "torch"

    def __init__(self, native_kernels: bool = True, torch_compile: bool = True, int8_activations: bool = False,
                 batch_invariant: bool = False, num_threads: int | None = None) -> None:
        super().__init__(torch.device("cpu"))
        if num_threads:
            torch.set_num_threads(num_threads)
        self.options = LinearOptions(native_kernels, torch_compile, int8_activations, batch_invariant)
        self.native = NativeKernels() if native_kernels else None

    @classmethod
    def from_config(cls, config: WorkerConfig) -> CpuPlatform:
        return cls(config.native_kernels, config.torch_compile, config.int8_activations, config.batch_invariant,
                   config.num_threads)

    def serving_dtype(self, checkpoint: torch.dtype, model_dir: str | None = None) -> torch.dtype:
        """GPTQ / AWQ checkpoints (whatever their config's dtype) run in fp32 where the C GEMMs run their codes.
        bf16 checkpoints keep their dtype. fp32 checkpoints whose projections are exact 4-bit grids stay fp32
        where the C int8 kernel runs them (it reads half a byte a weight where bf16 reads two: one stream decodes
        about 2.7x faster than in bf16 on a Zen 4 CPU, docs/cpu.md), and so do GGUF checkpoints where the C GEMMs
        run their blocks. Other fp32 and fp16 ones run in bf16 on CPUs
        with AVX512-BF16 or AMX, else in fp32 (fp16 and, without those, bf16 matmuls are slow on CPUs)."""
        if model_dir is not None and has_int4_scheme(model_dir) and self.takes_weight_grids(torch.float32):
            return torch.float32
        if checkpoint == torch.bfloat16:
            return checkpoint
        if checkpoint == torch.float32 and model_dir is not None and self._runs_grid_weights(model_dir):
            return torch.float32
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32

    def _runs_grid_weights(self, model_dir: str) -> bool:
        if self.native is not None and find_gguf(model_dir) is not None:
            return self.takes_weight_grids(torch.float32)
        if not self.options.int8_activations or self.native is None:
            return False
        return has_4bit_grid_weights(model_dir) and self.native.int8_linear is not None

    def kv_cache_dtype(self, name: str, model: torch.dtype) -> torch.dtype:
        """`auto`: float16 for an fp32 model (half the bytes a decode step reads; scores and sums stay fp32), else
        the model's; any dtype but fp8 may be asked for (no CPU attention path reads e4m3)."""
        if name in FP8_KV_NAMES:
            raise fp8_kv_refusal(name, self.name)
        if name == "auto":
            return torch.float16 if model == torch.float32 else model
        return parse_dtype(name, model)

    def kv_cache_budget_bytes(self, config: WorkerConfig) -> int:
        return config.kv_cache_memory_bytes

    def attention_backend(self, name: str, shape: AttentionShape, query_dtype: torch.dtype,
                          cache_dtype: torch.dtype, block_size: int) -> AttentionBackend:
        if self.backend_name(name) == "triton":
            if self.options.batch_invariant:
                raise ValueError("--batch-invariant runs on the torch attention backend with the C kernels")
            return attention.triton_backend(shape, attention.triton_interpreted())
        return attention.torch_backend(shape, query_dtype, cache_dtype, block_size, self.native,
                                       self.options.torch_compile, self.options.batch_invariant)

    def takes_weight_grids(self, dtype: torch.dtype) -> bool:
        """fp32 models whose C GEMMs build: they run 4- and 8-bit codes as they are."""
        return dtype == torch.float32 and self.native is not None and self.native.packed_linear is not None

    def bind_layers(self, model: DecoderLM) -> None:
        bind_linears(model.linears(), self.native, self.options)
        head = model.lm_head.kernel
        if (model.config.tie_word_embeddings and isinstance(model.embed_tokens, GridEmbedding)
                and isinstance(head, CGemmLinear) and isinstance(head.weight, PackedWeight)):
            model.embed_tokens.weight = head.weight  # the same codes: one copy
        if self.native is not None and self.native.fused_ops is not None:
            bind_fused_ops(model, self.native.fused_ops)

    def model_forward(self, model: DecoderLM, backend: AttentionBackend, kv_cache: KVCache) -> ModelForward:
        """The model's forward, or (fp32 models on the C kernels) one that runs decode-only steps in one C call."""
        forward = super().model_forward(model, backend, kv_cache)
        if self.native is None or not isinstance(backend, TorchAttentionBackend):
            return forward
        return build_one_call_decode(model, kv_cache, backend, self.native) or forward
