"""Section: paged decode and prefill (Triton) against SDPA's FLASH and cuDNN backends on dense K/V, graph-timed,
cold L2 (buffer sets rotated, timing.py). Llama-3-8B-like layer: 32 heads, 8 KV heads, head dim 128, bf16."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pagedserve.benchmarks.device.context import Section
from pagedserve.benchmarks.device.timing import Timing, l2_bytes, num_buffer_sets, time_calls

# Scaled error vs SDPA: both round P and the output to bf16 (u = 2**-8), bounded by ~9u for randn values.
MAX_BF16_ERR = 8 * 2**-8


@dataclass(frozen=True)
class Layer:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


LAYER = Layer(32, 8, 128)
DECODE_SIZES = [(1, 8192), (16, 8192), (64, 2048), (256, 8192)]
PREFILL_SIZES = [(1, 8192), (4, 8192)]
TOY_LAYER = Layer(4, 2, 32)
TOY_DECODE_SIZES = [(1, 64), (2, 128)]
TOY_PREFILL_SIZES = [(1, 32)]
BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


@dataclass
class BufferSet:
    """One item's tensors: the paged side for Triton and the same K/V dense ([B, KVH, S, D]) for SDPA."""

    query: torch.Tensor  # decode [B, H, D]; prefill [B * S, H, D]
    dense_query: torch.Tensor  # [B, H, q_len, D]
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    dense_key: torch.Tensor
    dense_value: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    out: torch.Tensor


def buffer_set(layer: Layer, batch: int, context: int, q_len: int, device: torch.device, seed: int) -> BufferSet:
    gen = torch.Generator(device=device).manual_seed(seed)
    num_blocks = batch * context // layer.block_size
    cache_shape = (num_blocks, layer.block_size, layer.num_kv_heads, layer.head_dim)
    key_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=layer.dtype)
    value_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=layer.dtype)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, -1).to(torch.int32)

    def dense(cache: torch.Tensor) -> torch.Tensor:
        return cache[tables.long()].reshape(batch, context, layer.num_kv_heads, layer.head_dim).transpose(1, 2) \
            .contiguous()

    dense_query = torch.randn(batch, layer.num_heads, q_len, layer.head_dim, generator=gen, device=device,
                              dtype=layer.dtype)
    query = dense_query[:, :, 0] if q_len == 1 else dense_query.transpose(1, 2).reshape(
        batch * q_len, layer.num_heads, layer.head_dim)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return BufferSet(query.contiguous(), dense_query, key_cache, value_cache, dense(key_cache), dense(value_cache),
                     tables, seq_lens, torch.empty_like(query))


def _set_bytes(layer: Layer, batch: int, context: int, q_len: int) -> int:
    kv = 2 * batch * context * layer.num_kv_heads * layer.head_dim * 2  # K and V, bf16
    return 2 * kv + 3 * batch * q_len * layer.num_heads * layer.head_dim * 2  # paged + dense K/V, q, q, out


def _sdpa(backend: SDPBackend, s: BufferSet, causal: bool) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(s.dense_query, s.dense_key, s.dense_value, is_causal=causal,
                                                  enable_gqa=True)
    return call


def _triton(kind: str, s: BufferSet, context: int, scale: float) -> Callable[[], torch.Tensor]:
    from pagedserve.kernels.paged_decode_attention import DecodeWorkspace, paged_decode_attention, workspace_rows
    from pagedserve.kernels.paged_prefill_attention import paged_prefill_attention

    if kind == "decode":
        batch, num_heads, head_dim = s.query.shape
        rows = workspace_rows(batch, num_heads, s.key_cache.shape[2], head_dim, context, s.query.device)
        # partials allocated once, as the engine's graphs hold them
        workspace = DecodeWorkspace.allocate(rows, head_dim, s.query.device)
        return lambda: paged_decode_attention(s.query, s.key_cache, s.value_cache, s.block_tables, s.seq_lens, scale,
                                              context, out=s.out, workspace=workspace)
    batch = s.seq_lens.shape[0]
    starts = torch.arange(batch + 1, dtype=torch.int32, device=s.query.device) * context
    return lambda: paged_prefill_attention(s.query, s.key_cache, s.value_cache, s.block_tables, s.seq_lens, starts,
                                           scale, context, out=s.out)


def _as_rows(kind: str, out: torch.Tensor, batch: int, context: int) -> torch.Tensor:
    """SDPA's [B, H, q_len, D] in the Triton layout."""
    if kind == "decode":
        return out[:, :, 0]
    return out.transpose(1, 2).reshape(batch * context, out.shape[1], out.shape[3])


def bench_item(section: Section, layer: Layer, kind: str, batch: int, context: int) -> dict:
    """One row: Triton vs each SDPA backend on the same data, all timed the same way."""
    device, causal = section.device, kind == "prefill"
    q_len = context if causal else 1
    sets = [buffer_set(layer, batch, context, q_len, device, seed) for seed in range(num_buffer_sets(
        _set_bytes(layer, batch, context, q_len), l2_bytes(device)))]
    scale = layer.head_dim ** -0.5
    reps = 1 if section.dry_run else 4 if causal else 20
    use_graph = section.state.capture_ok
    triton_calls = [_triton(kind, s, context, scale) for s in sets]
    s = sets[0]  # the reference: SDPA with whichever backend it picks (a backend refused below is a row's error)
    reference = _as_rows(kind, F.scaled_dot_product_attention(s.dense_query, s.dense_key, s.dense_value,
                                                              is_causal=causal, enable_gqa=True), batch, context)
    reference = reference.float()
    triton_out = triton_calls[0]().float()
    err = ((triton_out - reference).abs() / (1 + reference.abs())).max().item()
    timings: dict[str, Timing | str] = {"triton": time_calls(triton_calls, device, use_graph, reps)}
    for name, backend in BACKENDS.items():
        if name == "cudnn" and device.type != "cuda":
            timings[name] = "needs cuda: cuDNN attention is a CUDA library"
            continue
        try:
            timings[name] = time_calls([_sdpa(backend, s, causal) for s in sets], device, use_graph, reps)
        except RuntimeError as exc:
            timings[name] = f"error: {str(exc).splitlines()[0][:100]}"
    row = {"kind": kind, "batch": batch, "context": context, "buffer_sets": len(sets), "max_err": err,
           "err_ok": err <= MAX_BF16_ERR}
    for name, timing in timings.items():
        row[f"{name}_ms"] = timing.ms if isinstance(timing, Timing) else None
        row[f"{name}_how"] = timing.how if isinstance(timing, Timing) else timing
    for name in BACKENDS:
        if row[f"{name}_ms"] is not None:
            row[f"triton_speed_vs_{name}"] = row[f"{name}_ms"] / row["triton_ms"]
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run(section: Section) -> str | None:
    layer = TOY_LAYER if section.dry_run else LAYER
    items = [("decode", b, c) for b, c in (TOY_DECODE_SIZES if section.dry_run else DECODE_SIZES)]
    items += [("prefill", b, c) for b, c in (TOY_PREFILL_SIZES if section.dry_run else PREFILL_SIZES)]
    mismatches = []
    for kind, batch, context in items:
        if section.out_of_time(f"{kind} {batch}x{context}"):
            return "timed out: box spent (partial rows)"
        row = bench_item(section, layer, kind, batch, context)
        section.row(**row)
        if not row["err_ok"]:
            mismatches.append(f"{kind} {batch}x{context}")
    return f"failed: Triton and SDPA disagree beyond bf16 rounding on {', '.join(mismatches)}" if mismatches else None
