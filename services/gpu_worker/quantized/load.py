"""Load a GPTQ / AWQ / FP8 safetensors folder into DecoderLM (coded_model.py keeps the int4 grids where the
platform's kernels take them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.checkpoint_keys import to_model_state
from pagedserve.services.gpu_worker.coded_model import build_coded_model
from pagedserve.services.gpu_worker.gguf.checkpoint import concat_rows
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig
from pagedserve.services.gpu_worker.quantized.checkpoint import quantized_state
from pagedserve.services.gpu_worker.quantized.scheme import QuantScheme

if TYPE_CHECKING:
    import torch

    from pagedserve.services.gpu_worker.platforms.platform import Platform


def load_quantized_model(tensors: dict[str, torch.Tensor], scheme: QuantScheme, model_dir: str | Path,
                         config: ModelConfig, backend: AttentionBackend, max_positions: int,
                         platform: Platform) -> DecoderLM:
    """The model of the folder's checkpoint `tensors` on the platform's device, every layer bound."""
    state = to_model_state(quantized_state(tensors, scheme), config, concat=concat_rows)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return build_coded_model(state, config, backend, max_positions, platform, f"{scheme.method} checkpoint "
                             f"{model_dir}")
