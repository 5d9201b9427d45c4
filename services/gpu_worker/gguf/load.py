"""Load a GGUF checkpoint into DecoderLM: its quantized blocks as WeightGrids, built by coded_model.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.checkpoint_keys import to_model_state
from pagedserve.services.gpu_worker.coded_model import build_coded_model
from pagedserve.services.gpu_worker.gguf.checkpoint import Weight, concat_rows, read_gguf
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import Platform


def gguf_model_state(path: str | Path, config: ModelConfig) -> dict[str, Weight]:
    """DecoderLM's state from the GGUF file: fused projections, the tied head as the embedding's weight."""
    state = to_model_state(read_gguf(path, config), config, concat=concat_rows)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


def load_gguf_model(path: str | Path, config: ModelConfig, backend: AttentionBackend, max_positions: int,
                    platform: Platform) -> DecoderLM:
    """The model on the platform's device, every layer bound to the platform's kernels."""
    return build_coded_model(gguf_model_state(path, config), config, backend, max_positions, platform,
                             f"GGUF {path}")
