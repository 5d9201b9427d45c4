"""Load a GGUF checkpoint into DecoderLM: quantized projections stay grids (Linear.grid) where the platform's
kernels take them, the embedding reads its coded table in place; elsewhere every grid is dequantized."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from kernels.cpu.packed_linear import pack_weight
from kernels.cpu.weight_grid import WeightGrid
from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.checkpoint_keys import to_model_state
from services.gpu_worker.gguf.checkpoint import Weight, concat_rows, dequantize, read_gguf
from services.gpu_worker.layers.grid_embedding import GridEmbedding
from services.gpu_worker.layers.linear import Linear
from services.gpu_worker.model import DecoderLM
from services.gpu_worker.model_config import ModelConfig

if TYPE_CHECKING:
    from services.gpu_worker.platforms.platform import Platform

log = logging.getLogger(__name__)


def gguf_model_state(path: str | Path, config: ModelConfig) -> dict[str, Weight]:
    """DecoderLM's state from the GGUF file: fused projections, the tied head as the embedding's weight."""
    state = to_model_state(read_gguf(path, config), config, concat=concat_rows)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


def load_gguf_model(path: str | Path, config: ModelConfig, backend: AttentionBackend, max_positions: int,
                    platform: Platform) -> DecoderLM:
    """The model on the platform's device, every layer bound to the platform's kernels."""
    model = DecoderLM(config, backend, max_positions)
    state = gguf_model_state(path, config)
    keep_grids = platform.takes_weight_grids(config.dtype)
    if not keep_grids and any(isinstance(w, WeightGrid) for w in state.values()):
        log.info("dequantizing the GGUF's quantized weights to %s: this platform's kernels take no grids here",
                 config.dtype)
        state = {k: dequantize(w) if isinstance(w, WeightGrid) else w for k, w in state.items()}
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
        raise ValueError(f"GGUF {path} does not match {config.architecture}: missing {missing}, "
                         f"unexpected {unexpected}")
    model.rotary.to(device)
    platform.bind_layers(model)
    return model.eval()


def _is_grid(key: str, linears: dict[str, Linear]) -> bool:
    layer = linears.get(key.removesuffix(".weight"))
    return layer is not None and layer.grid is not None
