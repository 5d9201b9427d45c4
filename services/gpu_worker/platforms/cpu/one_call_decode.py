"""The CPU step forward with a fast path: every decoder layer of a step of decodes and short chunks in one C call
(kernels/cpu/decode_layers.c); other steps run through the model.

It applies when each layer already runs on the C kernels alone: an fp32 model whose projections are all on the C
GEMMs, the fused elementwise ops, the C decode attention (or, in batch-invariant mode, the C prefill attention
with decodes as one-token chunks), no q/k norms. The C call runs those same kernels in the same order on the same
rows (decodes through the decode kernel, chunks through the prefill kernel, as the torch backend splits a step), so
a step gives the same numbers either way; only the Python between them goes.

Steps taken: decode-only steps, and steps whose chunks are all short (at most MAX_CHUNK_ROWS rows: a speculative
verification's 1 + k tokens, a short prompt tail) where chunks run in the C prefill kernel (its block sizes are
multiples of 16). Longer prompt chunks go through the model: there the Python between kernels costs little next to
the kernels, and the C call's scratch would grow with the chunk.
"""

from __future__ import annotations

import logging

import torch

from pagedserve.kernels.cpu.build import built_or_none
from pagedserve.kernels.cpu.decode_layers import DecodeLayers, DecodeShape, Kernels, LayerWeights, Projection
from pagedserve.kernels.cpu.int8_linear import Int8Linear
from pagedserve.kernels.cpu.paged_decode import NativePagedDecode
from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.kv_cache import KVCache
from pagedserve.services.gpu_worker.layers.linear import Linear
from pagedserve.services.gpu_worker.model import DecoderLayer, DecoderLM
from pagedserve.services.gpu_worker.platforms.cpu.elementwise import fits
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from pagedserve.services.gpu_worker.platforms.cpu.native import NativeKernels
from pagedserve.services.gpu_worker.step_rows import KeptRows

log = logging.getLogger(__name__)


MAX_CHUNK_ROWS = 17  # the longest chunk a step on the one-call path holds: 1 + 16 drafts


class OneCallDecode:
    """A ModelForward: steps of decodes and short chunks over the cache it was built for in one C call, the rest via
    the model."""

    def __init__(self, model: DecoderLM, layers: DecodeLayers) -> None:
        self.model, self.layers = model, layers

    def __call__(self, token_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                 keep: KeptRows | None = None) -> torch.Tensor:
        split = self.split(meta)
        if split is None or kv_caches[0][0].data_ptr() != self.layers.cache_ptr:
            return self.model.forward(token_ids, positions, kv_caches, meta, keep)
        model = self.model
        cos, sin = model.rotary(positions)
        hidden = self.layers(model.embed_tokens(token_ids), cos, sin, meta.slot_mapping, meta.block_tables,
                             meta.seq_lens, *split)
        hidden = model.norm(hidden)
        return hidden if keep is None or keep.rows.num_rows == len(token_ids) else hidden[keep.indices]

    def split(self, meta: AttentionMetadata) -> tuple[int, torch.Tensor | None] | None:
        """(how many requests run as decodes, the other requests' query starts from their first row) as the torch
        backend splits the step, or None where the step is not taken here."""
        if meta.max_query_len > MAX_CHUNK_ROWS:
            return None
        kernels = self.layers.kernels
        if kernels.decode is None:  # batch-invariant mode: every request a chunk, a decode a one-token one
            return 0, meta.query_start_loc
        decodes = meta.num_decodes
        if decodes == meta.num_requests:
            return decodes, None
        if kernels.prefill is None:
            return None
        return decodes, meta.query_start_loc[decodes:] - meta.query_start_loc_cpu[decodes]


def build_one_call_decode(model: DecoderLM, kv_cache: KVCache, backend: TorchAttentionBackend,
                          native: NativeKernels) -> OneCallDecode | None:
    """The one-call decode forward for `model` over `kv_cache`, or None (with the reason logged) where it does
    not apply or cannot be built."""
    reason = unsupported(model, kv_cache, backend, native)
    if reason:
        log.info("decode steps run layer by layer: %s", reason)
        return None
    c = model.config
    shape = DecodeShape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps,
                        backend.shape.scale, backend.shape.sliding_window or 0)
    gemms = [m.kernel.gemm for layer in model.layers for m in _projections(layer)]
    int8 = next((gemm for gemm in gemms if isinstance(gemm, Int8Linear)), None)
    decode = None if backend.decodes_as_chunks or not isinstance(backend.decode_fn, NativePagedDecode) else (
        backend.decode_fn)
    prefill = backend.prefill_fn if isinstance(backend.prefill_fn, NativePagedPrefill) else None
    kernels = Kernels(int8, native.packed_linear, native.fused_ops, decode, prefill)
    layers = [_layer_weights(layer, key, value) for layer, (key, value) in zip(
        model.layers, kv_cache.layers, strict=True)]
    decode_layers = built_or_none("the C decode layers", lambda: _tried(DecodeLayers(kernels, shape, layers),
                                                                        c.hidden_size))
    return None if decode_layers is None else OneCallDecode(model, decode_layers)


def unsupported(model: DecoderLM, kv_cache: KVCache, backend: TorchAttentionBackend, native: NativeKernels) -> str:
    """Why the one-call path does not apply, or ''."""
    c = model.config
    if c.dtype != torch.float32 or kv_cache.key_caches[0].device.type != "cpu":
        return "not an fp32 model on CPU"
    if c.qk_norm:
        return "q/k norms"
    if native.fused_ops is None or native.packed_linear is None:
        return "the C linear or fused-op kernels are not built"
    if backend.decodes_as_chunks and not isinstance(backend.prefill_fn, NativePagedPrefill):
        return "decodes run as chunks outside the C prefill kernel"
    if not backend.decodes_as_chunks and not isinstance(backend.decode_fn, NativePagedDecode):
        return "decode attention does not run in the C decode kernel"
    if kv_cache.dtype not in (torch.float32, torch.float16):
        return f"a {kv_cache.dtype} KV cache"
    if not fits(model):
        return "sizes the fused ops do not take"
    if any(not isinstance(m.kernel, CGemmLinear) for layer in model.layers for m in _projections(layer)):
        return "a projection outside the C GEMMs"
    return ""


def _projections(layer: DecoderLayer) -> tuple[Linear, ...]:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _layer_weights(layer: DecoderLayer, key_cache: torch.Tensor, value_cache: torch.Tensor) -> LayerWeights:
    qkv, o, gate_up, down = (Projection(m.kernel.weight, m.bias) for m in _projections(layer))
    return LayerWeights(layer.input_layernorm.weight, layer.post_attention_layernorm.weight, qkv, o, gate_up, down,
                        key_cache, value_cache)


def _tried(layers: DecodeLayers, hidden_size: int) -> DecodeLayers:
    """One row over position 0 of block 0, writing nothing (slot -1): as a decode, then (with the prefill kernel)
    beside a one-row chunk."""
    cos = sin = torch.zeros(2, layers.layers[0].key_cache.shape[-1] // 2)
    out = layers(torch.zeros(1, hidden_size), cos[:1], sin[:1], torch.tensor([-1]),
                 torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32),
                 *((0, torch.tensor([0, 1], dtype=torch.int32)) if layers.kernels.decode is None else (1, None)))
    if layers.kernels.decode is not None and layers.kernels.prefill is not None:
        out = torch.cat((out, layers(torch.zeros(2, hidden_size), cos, sin, torch.tensor([-1, -1]),
                                     torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32), 1,
                                     torch.tensor([0, 1], dtype=torch.int32))))
    if not torch.isfinite(out).all():
        raise RuntimeError("the C decode layers gave non-finite numbers on zero inputs")
    return layers
