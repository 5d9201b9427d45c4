"""The CUDA platform: Triton attention kernels, plain F.linear, fused Triton kernels for RMSNorm(+residual), rotary
(in place) and SiLU-mul; its step forward is the model's own (the seam where captured CUDA graphs will go).

Quantized checkpoints' linears stay packed on the device: 4-bit grids over groups of 32 (GPTQ / AWQ, GGUF's 4-bit
types) as Int4Weights, FP8 weights with per-tensor or per-channel scales as FP8Weights, both run by the weight-only
Triton GEMM for small steps (cuda_linear.py); other grids (8-bit, groups of 16, the embedding's) and block-scaled
FP8 are dequantized at load."""

from __future__ import annotations

import torch

from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid
from pagedserve.kernels.weight_only_formats import Int4Weight
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from pagedserve.services.gpu_worker.attention.cpu_decode import compiled_paged_decode, paged_decode
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import FP8_KV_DTYPE, FP8_KV_NAMES
from pagedserve.services.gpu_worker.layers.linear import PlainLinear
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.model import MLP, Attention, DecoderLM
from pagedserve.services.gpu_worker.platforms.cuda_linear import WeightOnlyLinear
from pagedserve.services.gpu_worker.platforms.platform import Platform
from pagedserve.services.gpu_worker.worker_config import WorkerConfig


class CudaPlatform(Platform):
    name = "cuda"
    default_attention_backend = "triton"

    def __init__(self, device: torch.device, torch_compile: bool = True, batch_invariant: bool = False) -> None:
        """Touches no device: building the object is safe on a machine without one."""
        super().__init__(device)
        if batch_invariant:
            raise ValueError("--batch-invariant is implemented on CPU only")
        self.torch_compile = torch_compile

    def serving_dtype(self, checkpoint: torch.dtype, model_dir: str | None = None) -> torch.dtype:
        """Half checkpoints keep their dtype; fp32 ones run in bf16 where the device supports it."""
        if checkpoint in (torch.bfloat16, torch.float16):
            return checkpoint
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32

    def kv_cache_dtype(self, name: str, model: torch.dtype) -> torch.dtype:
        """As the base, plus fp8 / fp8_e4m3: a float8_e4m3fn cache (1 byte an element) under any model dtype."""
        return FP8_KV_DTYPE if name in FP8_KV_NAMES else super().kv_cache_dtype(name, model)

    def kv_cache_budget_bytes(self, config: WorkerConfig) -> int:
        """A fraction of the device memory still free after the weights were loaded."""
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        return int(free_bytes * config.gpu_memory_utilization)

    def attention_backend(self, name: str, shape: AttentionShape, query_dtype: torch.dtype,
                          cache_dtype: torch.dtype, block_size: int) -> AttentionBackend:
        if self.backend_name(name) == "torch":
            if cache_dtype == FP8_KV_DTYPE:
                raise ValueError("--kv-cache-dtype fp8 needs --attention-backend triton (the torch one reads no e4m3)")
            return TorchAttentionBackend(shape, compiled_paged_decode() if self.torch_compile else paged_decode)
        from pagedserve.services.gpu_worker.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(shape)

    def takes_linear_grid(self, grid: WeightGrid, dtype: torch.dtype) -> bool:
        """4-bit codes over groups of 32: the weight-only Triton GEMM's Int4Weight."""
        return grid.bits == 4 and grid.group == GROUP

    def keeps_fp8_weights(self, dtype: torch.dtype) -> bool:
        return True

    def bind_layers(self, model: DecoderLM) -> None:
        """F.linear for every dense linear (a lone row is one GEMV here: no two-row workaround), WeightOnlyLinear
        for the quantized ones (moved to the device packed), and the fused Triton kernels for the norms, the
        rotary and the activation (imported here: @triton.jit reads TRITON_INTERPRET when a kernel is defined, and
        a CPU test may build this platform with the interpreter on)."""
        from pagedserve.kernels.fused_rms_norm import fused_rms_norm
        from pagedserve.kernels.rotary_embedding import rotary_in_place
        from pagedserve.kernels.silu_and_mul import fused_silu_and_mul

        for layer in model.linears():
            if layer.grid is not None:
                packed = Int4Weight.from_grid(layer.grid).to(self.device)
                layer.kernel, layer.grid = WeightOnlyLinear(packed, layer.bias), None
            elif layer.fp8 is not None:
                layer.kernel, layer.fp8 = WeightOnlyLinear(layer.fp8.to(self.device), layer.bias), None
            else:
                layer.kernel = PlainLinear(layer.weight, layer.bias)
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.kernel = fused_rms_norm
            elif isinstance(module, Attention):
                module.rotate = rotary_in_place
            elif isinstance(module, MLP):
                module.act = fused_silu_and_mul
