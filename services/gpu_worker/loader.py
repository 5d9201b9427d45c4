"""Load a Hugging Face model folder's safetensors into DecoderLM, fusing q|k|v and gate|up on the way (a folder
holding a GGUF file instead: gguf/load.py; a GPTQ / AWQ / FP8 checkpoint: quantized/load.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.checkpoint_keys import to_model_state
from pagedserve.services.gpu_worker.dummy_weights import dummy_state
from pagedserve.services.gpu_worker.kv_scales import apply_kv_scales, pop_kv_scales
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig
from pagedserve.services.gpu_worker.quantized.scheme import read_scheme
from pagedserve.shared.gguf_folder import find_gguf

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import Platform

def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The folder's *.safetensors files, in name order (one, or the shards of a sharded checkpoint)."""
    return sorted(Path(model_dir).glob("*.safetensors"))


def read_checkpoint(model_dir: str | Path,
                    take: Callable[[str, Any], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in the folder: whole, or what `take(name, lazy slice)` reads of it
    (a tensor-parallel rank reads only its part)."""
    files = checkpoint_files(model_dir)
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in model folder {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                tensors[name] = f.get_tensor(name) if take is None else take(name, f.get_slice(name))
    return tensors


def load_model(model_dir: str | Path, config: ModelConfig, backend: AttentionBackend, max_positions: int,
               platform: Platform, load_format: str = "auto", quantization: str | None = None) -> DecoderLM:
    """The model on the platform's device, every layer bound to the platform's kernels; `load_format` "dummy":
    seeded random weights instead of the checkpoint's (dummy_weights.py); a folder holding a GGUF file and no
    safetensors loads from its blocks (gguf/load.py); one whose config.json has a quantization_config (which
    `quantization`, when given, must name) loads through quantized/load.py."""
    gguf = None if any(Path(model_dir).glob("*.safetensors")) else find_gguf(model_dir)
    if gguf is not None and load_format != "dummy":
        from pagedserve.services.gpu_worker.gguf.load import load_gguf_model

        return load_gguf_model(gguf, config, backend, max_positions, platform)
    scheme = read_scheme(model_dir, quantization)
    if scheme is not None and load_format != "dummy":
        from pagedserve.services.gpu_worker.quantized.load import load_quantized_model

        return load_quantized_model(read_checkpoint(model_dir), scheme, model_dir, config, backend, max_positions,
                                    platform)
    model = DecoderLM(config, backend, max_positions)
    device = platform.device
    if load_format == "dummy":
        state = dummy_state(model, device)
    else:
        checkpoint = read_checkpoint(model_dir)
        apply_kv_scales(model, pop_kv_scales(checkpoint))
        state = {k: v.to(device=device, dtype=config.dtype) for k, v in to_model_state(checkpoint, config).items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]  # one tensor for both
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match {config.architecture}: missing {missing}, unexpected {unexpected}")
    model.rotary.to(device)
    platform.bind_layers(model)
    return model.eval()
