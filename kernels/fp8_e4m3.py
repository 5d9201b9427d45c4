"""float8 e4m3fn codes (torch.float8_e4m3fn, Triton's fp8e4nv) in integer ops: fp32 -> codes for the fp8 KV cache,
codes -> fp32 for fp8 weights stored as uint8 (the weight-only GEMM).

Contract: `encode_e4m3(x)` returns, as uint8, exactly the bits torch's `x.clamp(-448, 448).to(torch.float8_e4m3fn)`
gives: round to nearest even, saturated to +-448 (e4m3fn has no infinity), NaN -> 0x7F, subnormals (|x| < 2**-6,
steps of 2**-9) rounded to nearest even too. The kernels store these codes through a uint8 view of the cache and
read it back as fp8e4nv (`.to(tl.float32)` is exact: every e4m3 value is an fp16/bf16/fp32 value).

Why not `x.to(tl.float8e4nv)`: Triton's interpreter (the CPU tests) rounds a value whose mantissa carries into the
next binade down instead of up (126.4 -> 64, not 128), so its conversion is not torch's; the integer path is the
same on the interpreter and on a GPU, and costs a few integer ops per element of a write that is memory-bound.
"""

from __future__ import annotations

import triton
import triton.language as tl

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn


@triton.jit
def encode_e4m3(x):
    """uint8 e4m3fn codes of fp32 `x` (any shape), rounded to nearest even and saturated to +-448."""
    bits = x.to(tl.int32, bitcast=True)
    sign = tl.where(bits < 0, 0x80, 0)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    mag = tl.minimum(tl.abs(x), 448.0)
    mag_bits = mag.to(tl.int32, bitcast=True)
    # Normal range (|x| >= 2**-6): keep 3 of the 23 mantissa bits, ties to even; a carry moves into the exponent.
    rounded = (mag_bits + 0x7FFFF + ((mag_bits >> 20) & 1)) >> 20
    normal = rounded - (120 << 3)  # rebias the exponent: fp32's 127 -> e4m3's 7
    # Subnormal range: adding 2**14 leaves an fp32 whose last mantissa bit is worth 2**-9, so the fp32 add rounds
    # |x| to a multiple of 2**-9 (ties to even); the low bits then count those steps (8 steps = 2**-6, code 0x08).
    sub = ((mag + 16384.0).to(tl.int32, bitcast=True) - 0x46800000)
    code = tl.where(mag_bits < 0x3C800000, sub, normal) | sign
    return tl.where(is_nan, 0x7F, code).to(tl.uint8)


@triton.jit
def decode_e4m3(bits):
    """float8_e4m3fn bit patterns (int32 0-255) -> fp32: a normal's exponent and mantissa moved into fp32's
    fields with the bias 7 -> 127, a subnormal (exponent 0) as mantissa * 2**-9. NaN (0x7f / 0xff) is not decoded
    (weights hold none)."""
    magnitude = bits & 0x7F
    normal = ((magnitude << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    subnormal = (magnitude & 7).to(tl.float32) * 0.001953125
    value = tl.where(magnitude < 8, subnormal, normal)
    return tl.where(bits >= 128, -value, value)
