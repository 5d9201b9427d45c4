"""Bind the C fused elementwise ops (kernels/cpu/fused_ops.c) to the layers whose dtype and widths they take."""

from __future__ import annotations

import torch

from pagedserve.kernels.cpu.fused_ops import LANES, FusedOps
from pagedserve.kernels.cpu.fused_ops import supports as supports_fused
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.model import MLP, Attention, DecoderLM


def bind_fused_ops(model: DecoderLM, ops: FusedOps) -> None:
    """Norms (with the residual add), rotary embeddings (in place) and SiLU-and-multiply through `ops` wherever
    the model's dtype and the layer's width fit; other layers keep their torch kernels."""
    probe = torch.empty(0, dtype=model.config.dtype)
    for module in model.modules():
        if isinstance(module, RMSNorm) and supports_fused(probe, module.weight.shape[0]):
            module.kernel = ops.rms_norm
        elif isinstance(module, Attention) and supports_fused(probe, module.config.head_dim // 2):
            module.rotate = _in_place_rotary(ops)
        elif isinstance(module, MLP) and supports_fused(probe, module.down_proj.in_features):
            module.act = ops.silu_mul


def fits(model: DecoderLM) -> bool:
    """Every width of the model is one the fused ops take."""
    c = model.config
    return not any(size % LANES for size in (c.hidden_size, c.intermediate_size, c.head_dim // 2))


def _in_place_rotary(ops: FusedOps):
    def rotate(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        ops.rotary_(q, cos, sin)  # in place: q and k are this step's own tensors
        ops.rotary_(k, cos, sin)
        return q, k

    return rotate
