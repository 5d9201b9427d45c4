"""The attention backend interface: write a step's keys/values into the paged cache, then attend through it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int  # num_heads % num_kv_heads == 0 (GQA/MQA when smaller)
    head_dim: int
    scale: float  # softmax scale, usually head_dim ** -0.5
    sliding_window: int | None = None  # a query at position p sees keys at positions > p - sliding_window


@dataclass(frozen=True)
class KVScales:
    """One layer's fp8 KV scales (vLLM's k_scale / v_scale): an e4m3 cache holds key / k_scale, value / v_scale.
    Caches of other dtypes ignore them."""

    k_scale: float = 1.0
    v_scale: float = 1.0


UNIT_SCALES = KVScales()


class AttentionBackend(ABC):
    """One implementation per device family. Caches are shaped [num_blocks, block_size, num_kv_heads, head_dim],
    in the model's dtype or (CPU) a narrower one than the queries' (an fp16 cache under fp32 queries), or (CUDA,
    Triton backend) float8_e4m3fn scaled by each layer's KVScales."""

    name: str

    def __init__(self, shape: AttentionShape) -> None:
        self.shape = shape

    @abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, scales: KVScales = UNIT_SCALES) -> None:
        """Store key/value rows [T, num_kv_heads, head_dim] at their slots; a negative slot is skipped."""

    @abstractmethod
    def attend(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               meta: AttentionMetadata, scales: KVScales = UNIT_SCALES) -> torch.Tensor:
        """Causal attention of query rows [T, num_heads, head_dim] over each request's paged context."""

    def warm_up(self, key_cache: torch.Tensor, value_cache: torch.Tensor, query_dtype: torch.dtype | None = None
                ) -> None:
        """Compile or autotune ahead of the first step (default: nothing to do); queries are `query_dtype`, by
        default the caches' dtype."""
        return None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                value_cache: torch.Tensor, meta: AttentionMetadata, scales: KVScales = UNIT_SCALES) -> torch.Tensor:
        self.write_kv(key, value, key_cache, value_cache, meta.slot_mapping, scales)
        return self.attend(query, key_cache, value_cache, meta, scales)
