"""Checkpoint tensor names to DecoderLM's parameter names, fusing q|k|v and gate|up: one mapping for every
checkpoint format the loaders read (safetensors folders, GGUF files)."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from pagedserve.services.gpu_worker.model_config import ModelConfig

_FUSED = {  # fused parameter -> the checkpoint parameters concatenated (along dim 0) to make it
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")



def to_model_state(checkpoint: dict, config: ModelConfig, concat: Callable[[list], object] = torch.cat) -> dict:
    """Rename checkpoint keys to DecoderLM's and fuse the split projections (`concat` stacks their rows)."""
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
        state[key] = concat([parts[p] for p in _FUSED[fused]])
    return state
