"""DecoderLM from a state whose linear weights may be WeightGrids (GGUF blocks, GPTQ / AWQ codes) or FP8Weights:
grids stay grids (Linear.grid) where the platform's kernels take them (all of them, the embedding then reading a
coded table in place: Platform.takes_weight_grids; or a linear's own: Platform.takes_linear_grid); every other grid
is dequantized, its memory cost logged. FP8Weights (only built for a platform that keeps them) go to Linear.fp8."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from pagedserve.kernels.cpu.packed_linear import pack_weight
from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.kernels.weight_only_formats import FP8Weight
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.gguf.checkpoint import dequantize
from pagedserve.services.gpu_worker.layers.grid_embedding import GridEmbedding
from pagedserve.services.gpu_worker.layers.linear import Linear
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import Platform

log = logging.getLogger(__name__)
Weight = torch.Tensor | WeightGrid | FP8Weight


def build_coded_model(state: Mapping[str, Weight], config: ModelConfig, backend: AttentionBackend,
                      max_positions: int, platform: Platform, source: str) -> DecoderLM:
    """The model of DecoderLM's `state` (fused projections; the tied head under lm_head.weight too) on the
    platform's device, every layer bound to the platform's kernels; `source` names the checkpoint in errors."""
    model = DecoderLM(config, backend, max_positions)
    state = _dequantize_untaken(state, platform, config.dtype, source)
    embed = state.pop("embed_tokens.weight")
    if isinstance(embed, WeightGrid):
        model.embed_tokens = GridEmbedding(pack_weight(None, grid=embed), config.dtype)
    else:
        state["embed_tokens.weight"] = embed
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in state.items():
        if isinstance(weight, WeightGrid):
            linears[key.removesuffix(".weight")].grid = weight
        elif isinstance(weight, FP8Weight):
            linears[key.removesuffix(".weight")].fp8 = weight
        else:
            tensors[key] = weight
    device = platform.device
    dense = {k: v.to(device=device, dtype=config.dtype) for k, v in tensors.items()}
    if config.tie_word_embeddings and "embed_tokens.weight" in dense:
        dense["lm_head.weight"] = dense["embed_tokens.weight"]  # one tensor for both
    missing, unexpected = model.load_state_dict(dense, strict=False, assign=True)
    missing = [k for k in missing if not _is_grid(k, linears) and not k.startswith("embed_tokens.")]
    if missing or unexpected:
        raise ValueError(f"{source} does not match {config.architecture}: missing {missing}, "
                         f"unexpected {unexpected}")
    model.rotary.to(device)
    platform.bind_layers(model)
    return model.eval()


def _dequantize_untaken(state: Mapping[str, Weight], platform: Platform, dtype: torch.dtype,
                        source: str) -> dict[str, Weight]:
    """`state` with every grid the platform does not take dequantized (their size in `dtype` logged)."""
    if platform.takes_weight_grids(dtype):
        return dict(state)
    untaken = {k: w for k, w in state.items() if isinstance(w, WeightGrid)
               and (k == "embed_tokens.weight" or not platform.takes_linear_grid(w, dtype))}
    if untaken:
        size = dtype.itemsize * sum(g.codes.numel() for g in {id(g): g for g in untaken.values()}.values())
        log.info("dequantizing %d of %s's quantized weights to %s (%.1f MiB): this platform's kernels take no "
                 "such grids", len(untaken), source, dtype, size / 2**20)
    dense = {id(g): dequantize(g) for g in untaken.values()}  # a tied head's grid once
    return {k: dense[id(w)] if k in untaken else w for k, w in state.items()}


def _is_grid(key: str, linears: dict[str, Linear]) -> bool:
    layer = linears.get(key.removesuffix(".weight"))
    return layer is not None and (layer.grid is not None or layer.fp8 is not None)
