"""Weight-only quantized GEMMs: y = x @ dequant(W).T (+ bias), W kept packed (weight_only_formats.py) and decoded
tile by tile in registers, never written out dequantized.

Contracts: x [M, K] (fp16 / bf16 on a GPU, fp32 too; strided rows are read in place, a non-unit last stride is
copied); y [M, N] in x's dtype; products accumulate in fp32, and a decoded tile is cast to x's dtype before its
dot (exact for e4m3 in fp16 / bf16, one rounding of code * scale + offset for int4). Int4: K a multiple of 32.
FP8: any K; the row scale multiplies the fp32 sum. One program per BLOCK_M x BLOCK_N output tile, looping over K
in BLOCK_K steps; tile sizes are constexprs (tl.dot needs each >= 16). Built for small M (decode steps): the
caller (the CUDA platform's WeightOnlyLinear) switches to a dequantize-then-F.linear fallback above its row
threshold.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedserve.kernels.fp8_e4m3 import decode_e4m3
from pagedserve.kernels.tile_dot import needs_fp32_dot, tile_dot
from pagedserve.kernels.weight_only_formats import FP8Weight, Int4Weight

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64
GROUP = 32  # inputs per (scale, offset) of an Int4Weight


@triton.jit
def _int4_linear_kernel(x_ptr, packed_ptr, scales_ptr, offsets_ptr, bias_ptr, out_ptr, M, N, K, stride_xm,
                        stride_om, HAS_BIAS: tl.constexpr, FP32_DOT: tl.constexpr, GROUP_SIZE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    rows_n = offs_n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w_mask = mask_k[:, None] & mask_n[None, :]  # the tile is W.T: [BLOCK_K, BLOCK_N]
        byte = tl.load(packed_ptr + rows_n[None, :] * (K // 2) + (offs_k // 2)[:, None], mask=w_mask, other=0)
        code = (byte.to(tl.int32) >> ((offs_k % 2) * 4)[:, None]) & 15
        group = rows_n[None, :] * (K // GROUP_SIZE) + (offs_k // GROUP_SIZE)[:, None]
        scale = tl.load(scales_ptr + group, mask=w_mask, other=0.0)
        offset = tl.load(offsets_ptr + group, mask=w_mask, other=0.0)
        w = code.to(tl.float32) * scale + offset
        acc += tile_dot(x, w.to(x.dtype), FP32_DOT)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _fp8_linear_kernel(x_ptr, bits_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_om,
                       HAS_BIAS: tl.constexpr, FP32_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = offs_m < M, offs_n < N
    rows_n = offs_n.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        bits = tl.load(bits_ptr + rows_n[None, :] * K + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :],
                       other=0)
        w = decode_e4m3(bits.to(tl.int32))
        acc += tile_dot(x, w.to(x.dtype), FP32_DOT)
    acc *= tl.load(scale_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x checked to be [rows, in_features], with a unit last stride (copied where it has none)."""
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x {tuple(x.shape)} is not [rows, {in_features}]")
    return x if x.stride(1) == 1 else x.contiguous()


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(weight).T (+ bias) -> [M, N] in x's dtype."""
    out_features, in_features = weight.shape
    x = _rows(x, in_features)
    out = torch.empty((x.shape[0], out_features), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    grid = (triton.cdiv(x.shape[0], BLOCK_M), triton.cdiv(out_features, BLOCK_N))
    _int4_linear_kernel[grid](
        x, weight.packed, weight.scales, weight.offsets, bias if bias is not None else weight.scales, out,
        x.shape[0], out_features, in_features, x.stride(0), out.stride(0), HAS_BIAS=bias is not None,
        FP32_DOT=needs_fp32_dot(x.dtype, _int4_linear_kernel), GROUP_SIZE=GROUP, BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4,
    )
    return out


def fp8_linear(x: torch.Tensor, weight: FP8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (e4m3(weight.bits) * weight.scale[:, None]).T (+ bias) -> [M, N] in x's dtype."""
    out_features, in_features = weight.shape
    x = _rows(x, in_features)
    out = torch.empty((x.shape[0], out_features), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    grid = (triton.cdiv(x.shape[0], BLOCK_M), triton.cdiv(out_features, BLOCK_N))
    _fp8_linear_kernel[grid](
        x, weight.bits, weight.scale, bias if bias is not None else weight.scale, out, x.shape[0], out_features,
        in_features, x.stride(0), out.stride(0), HAS_BIAS=bias is not None,
        FP32_DOT=needs_fp32_dot(x.dtype, _fp8_linear_kernel), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        num_warps=4,
    )
    return out
