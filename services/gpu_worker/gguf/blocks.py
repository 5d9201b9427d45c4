"""GGUF tensors -> torch: quantized blocks as WeightGrids (codes with one scale and offset per group of inputs,
the same numbers as ggml's dequantization bit for bit), F32/F16/BF16 as plain tensors.

Block layouts follow ggml (ggml-common.h; the `gguf` package's quants.py dequantizes the same way): each row of
`in` weights is `in / 32` (or `in / 256` for K-quants) blocks of bytes, fp16 scales little-endian.
- Q4_0 (18 B / 32): d, 16 bytes of nibbles (low: inputs 0-15, high: 16-31); w = d * (q - 8).
- Q4_1 (20 B / 32): d, m, nibbles as Q4_0; w = d * q + m.
- Q5_0 (22 B / 32): d, 4 bytes of fifth bits (bit i: input i), nibbles as Q4_0; w = d * (q - 16).
- Q5_1 (24 B / 32): d, m, fifth bits and nibbles as Q5_0; w = d * q + m.
- Q8_0 (34 B / 32): d, 32 int8; w = d * q.
- Q4_K (144 B / 256): d, dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of 32, 128 bytes of
  nibbles (each 32 bytes: low nibbles one sub-block, high the next); w = d * sc * q - dmin * m.
- Q5_K (176 B / 256): as Q4_K plus 32 bytes of fifth bits (bit s of byte l: sub-block s, input l).
- Q6_K (210 B / 256): 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16 inputs), d;
  w = d * sc * (q - 32).
Each is a grid exactly: codes times scale are exact in fp32, so `codes * scale + offset` rounds as ggml does.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T

from pagedserve.kernels.cpu.weight_grid import WeightGrid

PLAIN_TYPES = (T.F32, T.F16, T.BF16)
GRID_TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K)
_BLOCK = {T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q8_0: (32, 34),
          T.Q4_K: (256, 144), T.Q5_K: (256, 176),
          T.Q6_K: (256, 210)}  # type -> (weights, bytes) per block


class UnsupportedTensorTypeError(ValueError):
    """A GGUF tensor of a type pagedserve does not serve."""


def check_type(name: str, qtype: T) -> None:
    if qtype not in PLAIN_TYPES and qtype not in GRID_TYPES:
        supported = ", ".join(t.name for t in (*GRID_TYPES, *PLAIN_TYPES))
        raise UnsupportedTensorTypeError(f"GGUF tensor {name!r} is {qtype.name}, which pagedserve does not serve "
                                         f"(supported: {supported}); requantize the file to one of those")


def plain_tensor(data: np.ndarray, qtype: T, shape: tuple[int, ...]) -> torch.Tensor:
    """An F32/F16/BF16 tensor's data (numpy, as GGUFReader gives it) -> fp32 torch [*shape]."""
    raw = torch.from_numpy(np.array(data, copy=True))
    if qtype == T.BF16:
        raw = raw.view(torch.uint8).view(torch.bfloat16)
    return raw.float().reshape(shape)


def grid_from_blocks(data: np.ndarray, qtype: T, out_features: int, in_features: int) -> WeightGrid:
    """A quantized tensor's blocks (uint8, [out, bytes a row]) -> its WeightGrid [out, in]."""
    weights, nbytes = _BLOCK[qtype]
    if in_features % weights:
        raise ValueError(f"{qtype.name} rows of {in_features} inputs are not whole blocks of {weights}")
    blocks = torch.from_numpy(np.array(data, copy=True)).view(torch.uint8).reshape(out_features, -1, nbytes)
    codes, scales, offsets, bits, group = _DECODERS[qtype](blocks)
    return WeightGrid(codes.reshape(out_features, in_features).contiguous(),
                      scales.reshape(out_features, -1).contiguous(), offsets.reshape(out_features, -1).contiguous(),
                      bits, group)


def _half(raw: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes -> [..., 1] fp32 from little-endian fp16."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(raw: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n]: the low nibbles, then the high ones."""
    return torch.cat((raw & 15, raw >> 4), dim=-1)


def _q4_0(b):
    d = _half(b[..., :2])
    return _nibbles(b[..., 2:]), d, -8 * d, 4, 32


def _q4_1(b):
    return _nibbles(b[..., 4:]), _half(b[..., :2]), _half(b[..., 2:4]), 4, 32


def _fifth_bits(raw: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes (a little-endian 32-bit word) -> [..., 32]: bit i of the word, input i's fifth bit."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((raw.unsqueeze(-1) >> shifts) & 1).flatten(-2)


def _q5_0(b):
    d = _half(b[..., :2])
    codes = (_nibbles(b[..., 6:]) | (_fifth_bits(b[..., 2:6]) << 4)).to(torch.int8) - 16
    return codes, d, torch.zeros_like(d), 8, 32


def _q5_1(b):
    codes = (_nibbles(b[..., 8:]) | (_fifth_bits(b[..., 4:8]) << 4)).to(torch.int8)
    return codes, _half(b[..., :2]), _half(b[..., 2:4]), 8, 32


def _q8_0(b):
    d = _half(b[..., :2])
    return b[..., 2:].contiguous().view(torch.int8), d, torch.zeros_like(d), 8, 32


def _k_scales(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: (d * sc, -(dmin * m)) [..., 8] from bytes 0-15 of each block."""
    d, dmin = _half(b[..., :2]), _half(b[..., 2:4])
    s = b[..., 4:16].reshape(*b.shape[:-1], 3, 4).to(torch.int32)
    low, high, mixed = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = torch.cat((low & 63, (mixed & 15) | ((low >> 2) & 48)), dim=-1)
    m = torch.cat((high & 63, (mixed >> 4) | ((high >> 2) & 48)), dim=-1)
    return d * sc.float(), -(dmin * m.float())


def _k_low_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 128] bytes -> [..., 8, 32] codes: each 32 bytes give one sub-block (low nibbles), then the next."""
    qs = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return torch.cat((qs & 15, qs >> 4), dim=-2).reshape(*qs.shape[:-3], 8, 32)


def _q4_k(b):
    scale, offset = _k_scales(b)
    return _k_low_nibbles(b[..., 16:]), scale, offset, 4, 32


def _q5_k(b):
    scale, offset = _k_scales(b)
    shifts = torch.arange(8, dtype=torch.uint8).view(8, 1)
    high = (b[..., 16:48].unsqueeze(-2) >> shifts) & 1
    return (_k_low_nibbles(b[..., 48:]) | (high << 4)).to(torch.int8), scale, offset, 8, 32


def _q6_k(b):
    low = b[..., :128].reshape(*b.shape[:-1], 2, 1, 64)
    low = torch.cat((low & 15, low >> 4), dim=-2).reshape(*b.shape[:-1], 8, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)
    high = ((b[..., 128:192].reshape(*b.shape[:-1], 2, 1, 32) >> shifts) & 3).reshape(*b.shape[:-1], 8, 32)
    codes = (low | (high << 4)).to(torch.int8) - 32
    scale = _half(b[..., 208:210]) * b[..., 192:208].contiguous().view(torch.int8).float()
    return codes, scale, torch.zeros_like(scale), 8, 16


_DECODERS = {T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0, T.Q4_K: _q4_k,
             T.Q5_K: _q5_k, T.Q6_K: _q6_k}
