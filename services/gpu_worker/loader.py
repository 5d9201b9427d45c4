"""Load a Hugging Face model folder's safetensors into DecoderLM, fusing q|k|v and gate|up on the way."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.dummy_weights import dummy_state
from services.gpu_worker.model import DecoderLM
from services.gpu_worker.model_config import ModelConfig

if TYPE_CHECKING:
    from services.gpu_worker.platforms.platform import Platform

_FUSED = {  # fused parameter -> the checkpoint parameters concatenated (along dim 0) to make it
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def read_checkpoint(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file in the folder (sharded checkpoints included)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in model folder {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                tensors[name] = f.get_tensor(name)
    return tensors


def to_model_state(checkpoint: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename checkpoint keys to DecoderLM's and fuse the split projections."""
    state: dict[str, torch.Tensor] = {}
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in checkpoint.items():
        if name == "lm_head.weight":
            if not config.tie_word_embeddings:
                state[name] = tensor
            continue
        match = _LAYER_KEY.match(name)
        if match is None:
            state[name.removeprefix("model.")] = tensor
            continue
        layer, module, kind = match.groups()
        fused = next((f for f, parts in _FUSED.items() if module in parts), None)
        if fused is None:
            state[f"layers.{layer}.{module}.{kind}"] = tensor
        else:
            pending.setdefault(f"layers.{layer}.{fused}.{kind}", {})[module] = tensor
    for key, parts in pending.items():
        fused = key.split(".", 2)[2].rsplit(".", 1)[0]
        state[key] = torch.cat([parts[p] for p in _FUSED[fused]], dim=0)
    return state


def load_model(model_dir: str | Path, config: ModelConfig, backend: AttentionBackend, max_positions: int,
               platform: Platform, load_format: str = "auto") -> DecoderLM:
    """The model on the platform's device, every layer bound to the platform's kernels; `load_format` "dummy":
    seeded random weights instead of the checkpoint's (dummy_weights.py)."""
    model = DecoderLM(config, backend, max_positions)
    device = platform.device
    if load_format == "dummy":
        state = dummy_state(model, device)
    else:
        state = {k: v.to(device=device, dtype=config.dtype) for k, v in to_model_state(
            read_checkpoint(model_dir), config).items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]  # one tensor for both
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match {config.architecture}: missing {missing}, unexpected {unexpected}")
    model.rotary.to(device)
    platform.bind_layers(model)
    return model.eval()
