"""The CUDA platform: Triton attention kernels, torch for the rest; its step forward is the model's own (the seam
where captured CUDA graphs will go)."""

from __future__ import annotations

import torch

from services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from services.gpu_worker.attention.cpu_decode import compiled_paged_decode, paged_decode
from services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from services.gpu_worker.platforms.platform import Platform
from services.gpu_worker.worker_config import WorkerConfig


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

    def kv_cache_budget_bytes(self, config: WorkerConfig) -> int:
        """A fraction of the device memory still free after the weights were loaded."""
        free_bytes, _ = torch.cuda.mem_get_info(self.device)
        return int(free_bytes * config.gpu_memory_utilization)

    def attention_backend(self, name: str, shape: AttentionShape, query_dtype: torch.dtype,
                          cache_dtype: torch.dtype, block_size: int) -> AttentionBackend:
        if self.backend_name(name) == "torch":
            return TorchAttentionBackend(shape, compiled_paged_decode() if self.torch_compile else paged_decode)
        from services.gpu_worker.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(shape)
