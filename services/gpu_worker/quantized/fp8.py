"""FP8 weights (float8_e4m3fn) with their scales -> dequantized weights: `weight * scale` in fp32, then the
serving dtype. Scales as the checkpoints hold them: `weight_scale` per tensor ([] or [1]) or per output channel
([out] or [out, 1]) (compressed-tensors float-quantized, vLLM's fp8), or `weight_scale_inv` per block of
`weight_block_size` (the `fp8` config with blocks, as DeepSeek and Qwen FP8 checkpoints)."""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn,)


def fp8_weight(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 [out, in] from fp8 `weight` [out, in] and a per-tensor, per-channel or per-block `scale`."""
    if weight.dtype not in FP8_DTYPES:
        raise ValueError(f"an fp8 checkpoint's weight is {weight.dtype}, not float8_e4m3fn")
    out_features, in_features = weight.shape
    scale = scale.float()
    if scale.numel() == 1:
        factor = scale.reshape(1, 1)
    elif scale.numel() == out_features and scale.dim() <= 2 and scale.shape[-1] in (1, out_features):
        factor = scale.reshape(out_features, 1)
    elif scale.dim() == 2:
        rows, cols = -(-out_features // scale.shape[0]), -(-in_features // scale.shape[1])
        factor = scale.repeat_interleave(rows, 0)[:out_features].repeat_interleave(cols, 1)[:, :in_features]
    else:
        raise ValueError(f"fp8 scale {tuple(scale.shape)} fits no [{out_features}, {in_features}] weight")
    return weight.float() * factor
