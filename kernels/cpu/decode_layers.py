"""All decoder layers of a step of decodes and chunks in one C call (decode_layers.c), over the other CPU kernels'
entry points and the layers' packed weights, bound once. Attention is split as the torch backend splits it: the
decode rows in the C decode kernel, the chunk rows (e.g. a speculative verification's 1 + k tokens) in the C prefill
kernel; in batch-invariant mode (no decode kernel) every request runs as a chunk there, a decode as a one-token one."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.build import bind, load_kernel
from pagedserve.kernels.cpu.fused_ops import FusedOps
from pagedserve.kernels.cpu.int8_linear import Int8Linear, Int8Weight
from pagedserve.kernels.cpu.packed_linear import PackedLinear, PackedWeight
from pagedserve.kernels.cpu.paged_decode import NativePagedDecode
from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill

_ptr, _int, _float = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
INT8, PACKED_F32, PACKED_CODED = 0, 1, 2  # decode_layers.c's projection kinds


class _Projection(ctypes.Structure):
    _fields_ = [("kind", _int), ("in_features", _int), ("out_features", _int), ("bits", _int),
                ("group", _int), ("base", _int), ("tensors", _ptr * 3), ("bias", _ptr)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _ptr), ("post_norm", _ptr), ("qkv", _Projection), ("o", _Projection),
                ("gate_up", _Projection), ("down", _Projection), ("key_cache", _ptr), ("value_cache", _ptr)]


_KERNELS = ("int8_linear", "packed_f32", "packed_coded", "rms_norm", "silu_mul", "rotary", "decode", "prefill")


class _Model(ctypes.Structure):
    _fields_ = [*((name, _ptr) for name in _KERNELS), ("layers", ctypes.POINTER(_Layer)),
                *((name, _int) for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                            "block_size", "window", "half_cache")),
                ("eps", _float), ("scale", _float)]


Weight = Int8Weight | PackedWeight


@dataclass(frozen=True)
class Projection:
    weight: Weight
    bias: torch.Tensor | None


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the C call takes it: fp32 norm weights, packed projections, its KV caches."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Projection
    o: Projection
    gate_up: Projection
    down: Projection
    key_cache: torch.Tensor
    value_cache: torch.Tensor


@dataclass(frozen=True)
class DecodeShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    scale: float
    window: int  # 0: none


@dataclass(frozen=True)
class Kernels:
    """The built kernels whose entry points the C call runs (int8: None when no layer takes int8 inputs); attention:
    `decode` for decode rows (None: batch-invariant mode, every row a chunk), `prefill` for chunk rows (None: steps
    with chunks are not taken); at least one of them."""

    int8: Int8Linear | None
    packed: PackedLinear
    fused: FusedOps
    decode: NativePagedDecode | None
    prefill: NativePagedPrefill | None = None

    def __post_init__(self) -> None:
        if self.decode is None and self.prefill is None:
            raise ValueError("the decode layers need an attention kernel: the decode one, the prefill one or both")


def _address(entry) -> int:
    return ctypes.cast(entry, ctypes.c_void_p).value or 0


def _projection(p: Projection) -> _Projection:
    w = p.weight
    base = 0
    if isinstance(w, Int8Weight):
        kind, bits, group, base, tensors = INT8, w.bits, w.group, w.base, w.tensors()
    else:
        kind, bits, group = (PACKED_F32, 32, 32) if w.bits == 32 else (PACKED_CODED, w.bits, w.group)
        tensors = tuple(t for t in (w.values, w.scales, w.offsets) if t is not None)
    if p.bias is not None and (p.bias.dtype != torch.float32 or not p.bias.is_contiguous()):
        raise ValueError("projection biases must be contiguous fp32")
    pointers = (_ptr * 3)(*(t.data_ptr() for t in tensors))
    bias = 0 if p.bias is None else p.bias.data_ptr()
    return _Projection(kind, w.in_features, w.out_features, bits, group, base, pointers, bias)


class DecodeLayers:
    """hidden [rows, hidden] fp32 (updated in place) through every layer of a step: decode rows first, then chunks."""

    def __init__(self, kernels: Kernels, shape: DecodeShape, layers: list[LayerWeights]) -> None:
        cache = layers[0].key_cache
        if cache.dtype not in (torch.float32, torch.float16) or not all(
                t.is_contiguous() for layer in layers for t in (layer.key_cache, layer.value_cache)):
            raise ValueError("the fused decode layers need contiguous fp32 or fp16 KV caches")
        for i, layer in enumerate(layers):
            _check_widths(i, layer, shape)
        if kernels.int8 is None and any(isinstance(p.weight, Int8Weight) for layer in layers
                                        for p in (layer.qkv, layer.o, layer.gate_up, layer.down)):
            raise ValueError("int8 weights without the int8 kernel")
        self.run = bind(load_kernel("decode_layers"), "decode_layers",
                        [ctypes.c_void_p, ctypes.c_void_p, _int, _ptr, _ptr, _ptr, _ptr, _int, _ptr, _int, _int, _ptr,
                         _int])
        self.layers = layers  # keeps every tensor the structs point into alive
        self.kernels, self.shape = kernels, shape
        self.cache_ptr = cache.data_ptr()
        self._structs = (_Layer * len(layers))(*(_layer(layer) for layer in layers))
        f32 = torch.float32
        entries = (kernels.int8.coded if kernels.int8 else None, kernels.packed.f32, kernels.packed.coded,
                   kernels.fused.entries["rms_norm", f32], kernels.fused.entries["silu_mul", f32],
                   kernels.fused.entries["rotary", f32],
                   kernels.decode.entries[f32, cache.dtype, shape.head_dim] if kernels.decode else None,
                   kernels.prefill.entries[f32, cache.dtype] if kernels.prefill else None)
        self._model = _Model(*(_address(e) if e is not None else 0 for e in entries), self._structs, len(layers),
                             shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate,
                             cache.shape[1], shape.window, int(cache.dtype == torch.float16), shape.eps, shape.scale)

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, num_decodes: int | None = None,
                 chunk_starts: torch.Tensor | None = None) -> torch.Tensor:
        """cos/sin [rows, (1,) D/2] fp32, slots [rows] int64; block_tables [B, nb] int32 and seq_lens [B] int32 of
        the step's requests, decodes first. The first `num_decodes` requests are one row each (None: every request,
        a decode-only step); `chunk_starts` [B - num_decodes + 1] gives the others' first rows counted from row
        num_decodes (None where there are none)."""
        num_decodes = len(seq_lens) if num_decodes is None else num_decodes
        num_chunks = len(seq_lens) - num_decodes
        if (chunk_starts is None) != (num_chunks == 0) or (
                chunk_starts is not None and (len(chunk_starts) != num_chunks + 1
                                              or int(chunk_starts[-1]) != hidden.shape[0] - num_decodes)):
            raise ValueError("chunk_starts must give each chunk's first row and end at the step's row count")
        if num_decodes and self.kernels.decode is None or num_chunks and self.kernels.prefill is None:
            raise ValueError("no attention kernel here for this step's decodes or chunks")
        hidden = hidden.contiguous()
        cos, sin = cos.contiguous(), sin.contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        slots = slots.to(torch.int64).contiguous()
        starts = None if chunk_starts is None else chunk_starts.to(torch.int32).contiguous()
        failed = self.run(ctypes.addressof(self._model), hidden.data_ptr(), hidden.shape[0], cos.data_ptr(),
                          sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), tables.shape[1], lens.data_ptr(),
                          num_decodes, num_chunks, 0 if starts is None else starts.data_ptr(),
                          torch.get_num_threads())
        if failed:
            raise MemoryError(f"the C decode layers failed (code {failed}: out of memory or an unsupported shape)")
        return hidden


def _check_widths(index: int, layer: LayerWeights, shape: DecodeShape) -> None:
    """decode_layers.c sizes its scratch from `shape` and runs each projection at its own width: they must agree."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    expected = {"qkv": (shape.hidden, q + 2 * kv), "o": (q, shape.hidden),
                "gate_up": (shape.hidden, 2 * shape.intermediate), "down": (shape.intermediate, shape.hidden)}
    for name, (in_features, out_features) in expected.items():
        w = getattr(layer, name).weight
        if (w.in_features, w.out_features) != (in_features, out_features):
            raise ValueError(f"layer {index}: the {name} projection is {w.in_features} -> {w.out_features}, the "
                             f"decode shape needs {in_features} -> {out_features}")


def _layer(layer: LayerWeights) -> _Layer:
    return _Layer(layer.input_norm.data_ptr(), layer.post_norm.data_ptr(), _projection(layer.qkv),
                  _projection(layer.o), _projection(layer.gate_up), _projection(layer.down),
                  layer.key_cache.data_ptr(), layer.value_cache.data_ptr())
