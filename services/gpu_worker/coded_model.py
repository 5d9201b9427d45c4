"""DecoderLM from a state whose linear weights may be WeightGrids (GGUF blocks, GPTQ / AWQ codes): grids stay
grids (Linear.grid) where the platform's kernels take them and the embedding reads a coded table in place;
elsewhere every grid is dequantized, its memory cost logged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from pagedserve.kernels.cpu.packed_linear import pack_weight
from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.gguf.checkpoint import dequantize
from pagedserve.services.gpu_worker.layers.grid_embedding import GridEmbedding
from pagedserve.services.gpu_worker.layers.linear import Linear
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import Platform

log = logging.getLogger(__name__)
Weight = torch.Tensor | WeightGrid


def build_coded_model(state: dict[str, Weight], config: ModelConfig, backend: AttentionBackend,
                      max_positions: int, platform: Platform, source: str) -> DecoderLM:
    """The model of DecoderLM's `state` (fused projections; the tied head under lm_head.weight too) on the
    platform's device, every layer bound to the platform's kernels; `source` names the checkpoint in errors."""
    model = DecoderLM(config, backend, max_positions)
    grids = [w for w in state.values() if isinstance(w, WeightGrid)]
    if grids and not platform.takes_weight_grids(config.dtype):
        size = config.dtype.itemsize * sum(g.codes.numel() for g in {id(g): g for g in grids}.values())
        log.info("dequantizing %s's quantized weights to %s (%.1f MiB): this platform's kernels take no grids "
                 "here", source, config.dtype, size / 2**20)
        state = {k: dequantize(w) if isinstance(w, WeightGrid) else w for k, w in state.items()}
    state = dict(state)
    embed = state.pop("embed_tokens.weight")
    if isinstance(embed, WeightGrid):
        model.embed_tokens = GridEmbedding(pack_weight(None, grid=embed), config.dtype)
    else:
        state["embed_tokens.weight"] = embed
    linears = {name: m for name, m in model.named_modules() if isinstance(m, Linear)}
    for key in [k for k, w in state.items() if isinstance(w, WeightGrid)]:
        linears[key.removesuffix(".weight")].grid = state.pop(key)
    device = platform.device
    dense = {k: v.to(device=device, dtype=config.dtype) for k, v in state.items()}
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


def _is_grid(key: str, linears: dict[str, Linear]) -> bool:
    layer = linears.get(key.removesuffix(".weight"))
    return layer is not None and layer.grid is not None
