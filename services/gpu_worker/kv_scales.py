"""A checkpoint's fp8 KV cache scales: `model.layers.N.self_attn.k_scale` / `v_scale` (vLLM's names), one scalar
each, taken out of the checkpoint before its weights load and set on layer N's attention (`Attention.kv_scales`).

Layers the checkpoint gives no scale keep 1.0 (vLLM's default without calibration). Scales only change what an
fp8 (e4m3) cache stores (value / scale) and reads back (code x scale); other caches ignore them.
"""

from __future__ import annotations

import re

import torch

from pagedserve.services.gpu_worker.attention.backend import KVScales
from pagedserve.services.gpu_worker.model import DecoderLayer, DecoderLM

_SCALE_KEY = re.compile(r"^model\.layers\.(\d+)\.self_attn\.([kv])_scale$")


def pop_kv_scales(checkpoint: dict[str, torch.Tensor]) -> dict[int, KVScales]:
    """Remove the k/v scale tensors from `checkpoint`; each layer's scales (a missing one is 1.0)."""
    found: dict[int, dict[str, float]] = {}
    for name in [n for n in checkpoint if _SCALE_KEY.match(n)]:
        match = _SCALE_KEY.match(name)
        assert match is not None
        tensor = checkpoint.pop(name)
        if tensor.numel() != 1 or not float(tensor) > 0:
            raise ValueError(f"{name}: a KV cache scale must be one positive number, got {tensor.tolist()}")
        found.setdefault(int(match.group(1)), {})[f"{match.group(2)}_scale"] = float(tensor)
    return {layer: KVScales(**scales) for layer, scales in found.items()}


def apply_kv_scales(model: DecoderLM, scales: dict[int, KVScales]) -> None:
    """Give each layer named in `scales` its KVScales."""
    for index, layer_scales in scales.items():
        if index >= len(model.layers):
            raise ValueError(f"KV cache scales for layer {index}; the model has {len(model.layers)} layers")
        layer = model.layers[index]
        assert isinstance(layer, DecoderLayer)
        layer.self_attn.kv_scales = layer_scales
