"""Micro-benchmark: paged Triton decode/prefill attention vs torch scaled_dot_product_attention on dense tensors."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from kernels.paged_decode_attention import paged_decode_attention
from kernels.paged_prefill_attention import paged_prefill_attention


@dataclass(frozen=True)
class BenchShape:
    num_heads: int = 32  # Llama-3-8B-like attention layer
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


@dataclass(frozen=True)
class BenchRow:
    kind: str  # "decode" | "prefill"
    batch: int
    context: int
    triton_ms: float
    sdpa_ms: float
    max_err: float  # max |triton - sdpa| / (1 + |sdpa|) on the same data
    rate: float  # decode: KV cache GB/s read by Triton (memory bound); prefill: causal TFLOP/s (compute bound)


DECODE_SIZES = [(b, c) for b in (1, 16, 64, 256) for c in (512, 2048, 8192)]
PREFILL_SIZES = [(1, 512), (1, 2048), (1, 8192), (8, 2048), (32, 512), (4, 8192)]


def time_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds per call: CUDA events via triton on a GPU, wall clock (one warm call) elsewhere."""
    if device.type == "cuda":
        return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def to_paged(dense: torch.Tensor, block_size: int, block_ids: torch.Tensor) -> torch.Tensor:
    """[B, S, KVH, D] -> cache [B * S / block_size, block_size, KVH, D] with logical block l stored at block_ids[l]."""
    batch, seq, kv_heads, head_dim = dense.shape
    assert seq % block_size == 0, "benchmark contexts fill whole blocks"
    logical = dense.reshape(batch * seq // block_size, block_size, kv_heads, head_dim)
    cache = torch.empty_like(logical)
    cache[block_ids] = logical
    return cache


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """SDPA on [B, heads, S, D] tensors with grouped kv heads."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def scaled_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |out - ref| / (1 + |ref|): absolute for small outputs, relative for large ones."""
    ref = ref.float()
    return ((out.float() - ref).abs() / (1 + ref.abs())).max().item()


def _dense_inputs(shape: BenchShape, batch: int, q_len: int, context: int, device: torch.device):
    """Random q [B, q_len, H, D] and k, v [B, context, KVH, D], plus a scattered block table and its caches."""
    gen = torch.Generator(device=device).manual_seed(batch * 7919 + context)
    q = torch.randn(batch, q_len, shape.num_heads, shape.head_dim, generator=gen, device=device, dtype=shape.dtype)
    kv_shape = (batch, context, shape.num_kv_heads, shape.head_dim)
    k = torch.randn(kv_shape, generator=gen, device=device, dtype=shape.dtype)
    v = torch.randn(kv_shape, generator=gen, device=device, dtype=shape.dtype)
    num_blocks = batch * context // shape.block_size
    block_ids = torch.randperm(num_blocks, generator=gen, device=device)
    tables = block_ids.view(batch, -1).to(torch.int32)
    return q, k, v, to_paged(k, shape.block_size, block_ids), to_paged(v, shape.block_size, block_ids), tables


def bench_decode(shape: BenchShape, batch: int, context: int, device: torch.device) -> BenchRow:
    """One new token per request over `context` cached tokens."""
    q, k, v, key_cache, value_cache, tables = _dense_inputs(shape, batch, 1, context, device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    query = q[:, 0]

    def run_triton() -> torch.Tensor:
        return paged_decode_attention(query, key_cache, value_cache, tables, seq_lens, scale, context)

    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    err = scaled_err(run_triton(), sdpa(qt, kt, vt, False)[:, :, 0])
    triton_ms = time_ms(run_triton, device)
    sdpa_ms = time_ms(lambda: sdpa(qt, kt, vt, False), device)
    kv_bytes = 2 * k.numel() * k.element_size()
    return BenchRow("decode", batch, context, triton_ms, sdpa_ms, err, kv_bytes / triton_ms / 1e6)


def bench_prefill(shape: BenchShape, batch: int, context: int, device: torch.device) -> BenchRow:
    """A whole `context`-token prompt per request, causal, nothing cached beforehand."""
    q, k, v, key_cache, value_cache, tables = _dense_inputs(shape, batch, context, context, device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=device) * context
    query = q.reshape(batch * context, shape.num_heads, shape.head_dim)
    scale = shape.head_dim**-0.5

    def run_triton() -> torch.Tensor:
        return paged_prefill_attention(query, key_cache, value_cache, tables, seq_lens, query_start_loc, scale,
                                       context)

    qt, kt, vt = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    ref = sdpa(qt, kt, vt, True).transpose(1, 2).reshape(query.shape)
    err = scaled_err(run_triton(), ref)
    triton_ms = time_ms(run_triton, device)
    sdpa_ms = time_ms(lambda: sdpa(qt, kt, vt, True), device)
    causal_flops = 2 * 2 * batch * shape.num_heads * shape.head_dim * context * context / 2  # QK^T and PV, half masked
    return BenchRow("prefill", batch, context, triton_ms, sdpa_ms, err, causal_flops / triton_ms / 1e9)


def run_benchmarks(shape: BenchShape, decode_sizes: list[tuple[int, int]], prefill_sizes: list[tuple[int, int]],
                   device: torch.device) -> list[BenchRow]:
    """Every decode then every prefill size, freeing device memory between them."""
    rows = []
    for bench, sizes in ((bench_decode, decode_sizes), (bench_prefill, prefill_sizes)):
        for batch, context in sizes:
            rows.append(bench(shape, batch, context, device))
            print(format_row(rows[-1]), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


TABLE_HEADER = f"{'kind':<8}{'batch':>6}{'context':>9}{'triton ms':>11}{'sdpa ms':>10}{'speedup':>9}" \
               f"{'rate':>14}{'max err':>10}"


def format_row(row: BenchRow) -> str:
    """One table line; speedup > 1 means the paged Triton kernel beat dense SDPA."""
    unit = "GB/s" if row.kind == "decode" else "TFLOP/s"
    return (f"{row.kind:<8}{row.batch:>6}{row.context:>9}{row.triton_ms:>11.3f}{row.sdpa_ms:>10.3f}"
            f"{row.sdpa_ms / row.triton_ms:>9.2f}{row.rate:>6.1f} {unit:<7}{row.max_err:>10.2e}")
