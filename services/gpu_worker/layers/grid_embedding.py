"""Token embeddings read from a coded weight (a GGUF checkpoint's quantized table) without an fp32 copy."""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.kernels.cpu.packed_linear import PANEL, PackedWeight


class GridEmbedding(nn.Module):
    """ids [T] -> rows [T, hidden] of `weight` (a coded PackedWeight [vocab, hidden]), expanded as the C GEMM
    expands them: a tied output head may share the same panels."""

    def __init__(self, weight: PackedWeight, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight, self.dtype = weight, dtype

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        w = self.weight
        panel, column = token_ids // PANEL, token_ids % PANEL
        if w.bits == 4:
            codes = (w.values[panel, :, column % (PANEL // 2)] >> (4 * (column // (PANEL // 2))).unsqueeze(1)) & 15
        else:
            codes = w.values[panel, :, column]
        if w.bits == 32:
            return codes.to(self.dtype)
        scales = w.scales[panel, :, column].repeat_interleave(w.group, 1)
        offsets = w.offsets[panel, :, column].repeat_interleave(w.group, 1)
        return (codes.float() * scales + offsets).to(self.dtype)
