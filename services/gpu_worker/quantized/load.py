"""Load a GPTQ / AWQ / FP8 safetensors folder into DecoderLM (coded_model.py keeps the int4 grids where the
platform's kernels take them; FP8 weights stay FP8Weights where the platform keeps them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pagedserve.kernels.weight_only_formats import FP8Weight, concat_fp8
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
    keep_fp8 = platform.keeps_fp8_weights(config.dtype)
    state = to_model_state(quantized_state(tensors, scheme, keep_fp8), config, concat=_concat)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return build_coded_model(state, config, backend, max_positions, platform, f"{scheme.method} checkpoint "
                             f"{model_dir}")


def _concat(parts: list) -> object:
    """Fused projections' parts stacked along their rows: FP8Weights stay one when all parts are (else dequantized
    to fp32 first); tensors and grids as concat_rows stacks them."""
    if all(isinstance(p, FP8Weight) for p in parts):
        return concat_fp8(parts)
    return concat_rows([p.dequantize() if isinstance(p, FP8Weight) else p for p in parts])
