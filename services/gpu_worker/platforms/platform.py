"""The seam between the model and a device family: what the worker asks a platform, once, at load.

A platform decides the serving dtype and the KV cache's, sizes the KV pool, builds the attention backend, binds a
kernel to every layer once its weights are loaded, and hands back the forward a step runs. The model and its
layers only hold weights and call what they were given; per-step facts reach the kernels as arguments (the
attention metadata, StepRows), never as state a platform keeps in a layer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import get_args

import torch

from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.kv_cache import FP8_KV_NAMES, KVCache, fp8_kv_refusal
from pagedserve.services.gpu_worker.layers.linear import TorchLinear
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import parse_dtype
from pagedserve.services.gpu_worker.step_rows import KeptRows
from pagedserve.services.gpu_worker.worker_config import AttentionBackendName, WorkerConfig

BACKEND_NAMES = get_args(AttentionBackendName)

# (token_ids [T], positions [T], kv caches per layer, metadata, rows to keep or None) -> final hidden states
ModelForward = Callable[[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], AttentionMetadata,
                         "KeptRows | None"], torch.Tensor]


class Platform(ABC):
    name: str
    default_attention_backend: str  # what `--attention-backend auto` selects

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @abstractmethod
    def serving_dtype(self, checkpoint: torch.dtype, model_dir: str | None = None) -> torch.dtype:
        """The dtype `--dtype auto` serves a checkpoint of dtype `checkpoint` (in `model_dir`, when given) in."""

    def kv_cache_dtype(self, name: str, model: torch.dtype) -> torch.dtype:
        """The KV cache's dtype for `--kv-cache-dtype name` under a `model` model: `auto` is the model's; fp8 only
        where a platform says so."""
        if name in FP8_KV_NAMES:
            raise fp8_kv_refusal(name, self.name)
        chosen = model if name == "auto" else parse_dtype(name, model)
        if chosen != model:
            raise ValueError(f"a {name} KV cache under a {model} model is only supported on CPU")
        return chosen

    @abstractmethod
    def kv_cache_budget_bytes(self, config: WorkerConfig) -> int:
        """The bytes the KV pool may take (after the weights were loaded)."""

    @abstractmethod
    def attention_backend(self, name: str, shape: AttentionShape, query_dtype: torch.dtype,
                          cache_dtype: torch.dtype, block_size: int) -> AttentionBackend:
        """The backend `--attention-backend name` selects ("auto" | "torch" | "triton") for this device."""

    def backend_name(self, name: str) -> str:
        """`name` checked, with "auto" resolved to this platform's default."""
        if name not in BACKEND_NAMES:
            raise ValueError(f"unknown attention backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
        return self.default_attention_backend if name == "auto" else name

    def takes_weight_grids(self, dtype: torch.dtype) -> bool:
        """Whether a `dtype` model's linears may come as quantized grids (Linear.grid: a GGUF checkpoint's blocks)
        for bind_layers to run as they are (default: no, the loader dequantizes them)."""
        return False

    def takes_linear_grid(self, grid: WeightGrid, dtype: torch.dtype) -> bool:
        """Whether this linear `grid` of a `dtype` model stays a grid where takes_weight_grids says no (the
        embedding's is dequantized then; default: no)."""
        return False

    def keeps_fp8_weights(self, dtype: torch.dtype) -> bool:
        """Whether a `dtype` model's FP8 checkpoint weights (per-tensor or per-channel scales) come as FP8Weights
        (Linear.fp8) for bind_layers to run as they are (default: no, the loader dequantizes them)."""
        return False

    def bind_layers(self, model: DecoderLM) -> None:
        """Give every layer of `model` its kernels, after its weights are loaded (default: the portable torch ones,
        which the layers start with, and F.linear for the linears)."""
        for layer in model.linears():
            layer.kernel = TorchLinear(layer.weight, layer.bias)

    def model_forward(self, model: DecoderLM, backend: AttentionBackend, kv_cache: KVCache) -> ModelForward:
        """The forward a step runs over `kv_cache`, after the attention warmed up on it (default: the model's)."""
        backend.warm_up(*kv_cache.layers[0], query_dtype=model.config.dtype)
        return model.forward
