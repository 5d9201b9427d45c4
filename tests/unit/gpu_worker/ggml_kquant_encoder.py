"""A plain encoder of ggml's K-quant blocks (Q4_K, Q5_K, Q6_K), following ggml's published block layout
(ggml-common.h), for tests: the `gguf` package dequantizes these types but cannot quantize them. It rounds to the
nearest code with per-sub-block scales (no search as llama.cpp's quantizer does); the tests only need valid
blocks, which `gguf.quants.dequantize` then reads as the reference."""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _scale_min_bytes(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """[n, 8] 6-bit scales and mins -> [n, 12] bytes (the inverse of Q4_K.get_scale_min)."""
    out = np.zeros((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return out


def _affine_k(x: np.ndarray, levels: int):
    """[n, 256] -> codes [n, 8, 32], 6-bit sc / m [n, 8], d / dmin [n] with x ~ d * sc * q - dmin * m."""
    sub = x.reshape(-1, 8, 32)
    low = np.minimum(sub.min(-1), 0.0)
    step = (sub.max(-1) - low) / levels
    d = np.maximum(step.max(-1), 1e-8) / 63
    dmin = np.maximum((-low).max(-1), 1e-8) / 63
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / d[:, None]), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-low / dmin[:, None]), 0, 63).astype(np.uint8)
    scale = (d[:, None] * sc)[..., None]
    q = np.clip(np.round((sub + (dmin[:, None] * m)[..., None]) / scale), 0, levels).astype(np.uint8)
    return q, sc, m, d, dmin


def _low_nibbles(q: np.ndarray) -> np.ndarray:
    """codes [n, 8, 32] -> [n, 128]: each 32 bytes hold one sub-block in low nibbles and the next in high."""
    return ((q[:, 0::2] & 15) | ((q[:, 1::2] & 15) << 4)).reshape(-1, 128)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """fp32 [rows, in] -> Q4_K bytes [rows, in / 256 * 144]."""
    rows = x.shape[0]
    q, sc, m, d, dmin = _affine_k(x.reshape(-1, QK_K), 15)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _scale_min_bytes(sc, m), _low_nibbles(q)], axis=1)
    return blocks.reshape(rows, -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """fp32 [rows, in] -> Q5_K bytes [rows, in / 256 * 176]."""
    rows = x.shape[0]
    q, sc, m, d, dmin = _affine_k(x.reshape(-1, QK_K), 31)
    qh = np.zeros((q.shape[0], 32), np.uint8)
    for s in range(8):
        qh |= ((q[:, s] >> 4) & 1) << s
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), _scale_min_bytes(sc, m), qh, _low_nibbles(q)], axis=1)
    return blocks.reshape(rows, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """fp32 [rows, in] -> Q6_K bytes [rows, in / 256 * 210]: x ~ d * sc * (q - 32), sc int8 per 16 inputs."""
    rows = x.shape[0]
    sub = x.reshape(-1, 16, 16)
    step = np.abs(sub).max(-1) / 31
    d = (np.maximum(step.max(-1), 1e-8) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(step / d[:, None]), 1, 127).astype(np.int8)
    q = np.clip(np.round(sub / (d[:, None] * sc)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(-1, 2, 4, 32)  # halves of 128, quarters of 32
    ql = np.concatenate([(q[:, :, 0] & 15) | ((q[:, :, 2] & 15) << 4), (q[:, :, 1] & 15) | ((q[:, :, 3] & 15) << 4)],
                        axis=-1)  # [n, 2, 64]
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16_bytes(d)], axis=1)
    return blocks.reshape(rows, -1)
