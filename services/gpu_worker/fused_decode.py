"""The decode-only fast path on CPU: every decoder layer in one C call (kernels/cpu/decode_layers.c).

It applies when each layer already runs on the C kernels alone: an fp32 model whose projections are all packed
(fp32 or grid codes) or int8, the fused elementwise ops, the C decode attention, no q/k norms. The C call runs those
same kernels in the same order, so a step gives the same numbers either way; only the Python between them goes.
"""

from __future__ import annotations

import logging

import torch

from kernels.cpu.build import built_or_none
from kernels.cpu.decode_layers import DecodeLayers, DecodeShape, Kernels, LayerWeights, Projection
from kernels.cpu.fused_ops import LANES
from kernels.cpu.paged_decode import NativePagedDecode
from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.kv_cache import KVCache
from services.gpu_worker.model import DecoderLayer, DecoderLM

log = logging.getLogger(__name__)


def build_decode_layers(model: DecoderLM, kv_cache: KVCache, backend: AttentionBackend) -> DecodeLayers | None:
    """The one-call decode path for `model` over `kv_cache`, or None (with the reason logged) where it does not
    apply or cannot be built."""
    reason = _unsupported(model, kv_cache, backend)
    if reason:
        log.info("decode steps run layer by layer: %s", reason)
        return None
    c, proj = model.config, model.proj
    shape = DecodeShape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
                        backend.shape.scale, backend.shape.sliding_window or 0)
    kernels = Kernels(proj.int8, proj.packed, model.layers[0].input_layernorm.fused, backend.decode_fn)
    layers = [_layer_weights(model, layer, key, value) for layer, (key, value) in zip(
        model.layers, kv_cache.layers, strict=True)]
    return built_or_none("the C decode layers", lambda: _tried(DecodeLayers(kernels, shape, layers), c.hidden_size))


def _unsupported(model: DecoderLM, kv_cache: KVCache, backend: AttentionBackend) -> str:
    """Why the one-call path does not apply, or ''."""
    c = model.config
    if c.dtype != torch.float32 or kv_cache.key_caches[0].device.type != "cpu":
        return "not an fp32 model on CPU"
    if c.qk_norm:
        return "q/k norms"
    if model.layers[0].input_layernorm.fused is None or model.proj.packed is None:
        return "the C linear or fused-op kernels are not built"
    if not isinstance(getattr(backend, "decode_fn", None), NativePagedDecode):
        return "decode attention does not run in the C kernel"
    if kv_cache.dtype not in (torch.float32, torch.float16):
        return f"a {kv_cache.dtype} KV cache"
    if any(size % LANES for size in (c.hidden_size, c.intermediate_size, c.head_dim // 2)):
        return "sizes the fused ops do not take"
    if any(_packed(model, m) is None for layer in model.layers for m in _projections(layer)):
        return "a projection outside the C GEMMs"
    return ""


def _projections(layer: DecoderLayer) -> tuple[torch.nn.Module, ...]:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _packed(model: DecoderLM, module: torch.nn.Module):
    return model.proj.int8_weights.get(module) or model.proj.packed_weights.get(module)


def _layer_weights(model: DecoderLM, layer: DecoderLayer, key_cache: torch.Tensor,
                   value_cache: torch.Tensor) -> LayerWeights:
    qkv, o, gate_up, down = (Projection(_packed(model, m), m.bias) for m in _projections(layer))
    return LayerWeights(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qkv, o, gate_up, down,
                        key_cache, value_cache)


def _tried(layers: DecodeLayers, hidden_size: int) -> DecodeLayers:
    """One row over position 0 of block 0, writing nothing (slot -1)."""
    cos = sin = torch.zeros(1, layers.layers[0].key_cache.shape[-1] // 2)
    out = layers(torch.zeros(1, hidden_size), cos, sin, torch.tensor([-1]), torch.zeros(1, 1, dtype=torch.int32),
                 torch.ones(1, dtype=torch.int32))
    if not torch.isfinite(out).all():
        raise RuntimeError("the C decode layers gave non-finite numbers on zero inputs")
    return layers
