"""The paged KV cache: one key and one value tensor per layer, allocated once, sized from a memory budget.

The budget counts each element at its dtype's size, so an fp8 (float8_e4m3fn, 1 byte) cache holds twice the blocks
of an fp16 one in the same memory; an fp8 cache stores value / scale per layer (the attention's KVScales).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.model_config import ModelConfig

FP8_KV_NAMES = ("fp8", "fp8_e4m3")  # vLLM's --kv-cache-dtype names for an e4m3 cache
FP8_KV_DTYPE = torch.float8_e4m3fn


def fp8_kv_refusal(name: str, platform: str) -> ValueError:
    """The error a platform without fp8 KV support raises for `--kv-cache-dtype name`."""
    return ValueError(f"--kv-cache-dtype {name} is GPU-only (the CUDA platform's Triton attention reads e4m3 "
                      f"caches); this worker runs on {platform}: use auto, float16, bfloat16 or float32")


def kv_bytes_per_token(config: ModelConfig, dtype: torch.dtype | None = None) -> int:
    """The seed's formula: 2 (keys and values) x layers x KV heads x head dim x bytes per element (of `dtype`, the
    cache's, by default the model's)."""
    element_bytes = torch.empty((), dtype=dtype or config.dtype).element_size()
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element_bytes


def num_blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int,
                          dtype: torch.dtype | None = None) -> int:
    return budget_bytes // (kv_bytes_per_token(config, dtype) * block_size)


@dataclass
class KVCache:
    key_caches: list[torch.Tensor]  # per layer [num_blocks, block_size, num_kv_heads, head_dim]
    value_caches: list[torch.Tensor]
    num_blocks: int
    block_size: int

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype | None = None) -> KVCache:
        """Zeroed caches in `dtype`, by default the model's."""
        if num_blocks < 1:
            raise ValueError("the KV cache budget is too small for a single block; raise --kv-cache-memory")
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        dtype = dtype or config.dtype
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]
        return cls(keys, values, num_blocks, block_size)

    @property
    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(zip(self.key_caches, self.value_caches, strict=True))

    @property
    def dtype(self) -> torch.dtype:
        return self.key_caches[0].dtype

    @property
    def num_bytes(self) -> int:
        per_tensor = self.key_caches[0].numel() * self.key_caches[0].element_size()
        return 2 * len(self.key_caches) * per_tensor
