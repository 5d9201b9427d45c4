"""GPTQ and AWQ int4 tensors -> WeightGrids: codes with one scale and offset per 32 inputs, the published
dequantization `scale * (q - zero)` bit for bit in fp32 (q * scale and zero * scale are exact: 4-bit codes and
zeros times fp16 scales).

Layouts as AutoGPTQ and AutoAWQ write them (int32 words, 8 nibbles each, lowest nibble first):
- GPTQ: qweight [in / 8, out] packs 8 consecutive inputs of one output; qzeros [groups, out / 8] packs 8
  consecutive outputs; scales [groups, out] fp16; g_idx [in] the group of each input (i // group unless
  act-order); v1 checkpoints store zero - 1 (QuantScheme.zero_offset).
- AWQ (GEMM): qweight [in, out / 8] and qzeros [groups, out / 8] pack 8 outputs in the order 0, 2, 4, 6, 1, 3, 5,
  7 (nibble j holds output 8c + AWQ_ORDER[j]); scales [groups, out]; zeros stored as they are.
Groups of 32, 64, 128, ... inputs become groups of 32 by repeating their scale and offset (the C GEMMs' group);
an act-order GPTQ weight whose g_idx is not i // group is dequantized (no contiguous groups to keep).
"""

from __future__ import annotations

import torch

from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid
from pagedserve.services.gpu_worker.quantized.scheme import QuantScheme

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def unpack_rows(packed: torch.Tensor) -> torch.Tensor:
    """int32 [n / 8, m] -> uint8 [n, m]: nibble j of word [i, c] is row 8i + j."""
    nibbles = (packed.unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 15
    return nibbles.reshape(-1, packed.shape[1]).to(torch.uint8)


def unpack_columns(packed: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int32 [n, m / 8] -> uint8 [n, m]: nibble j of word [i, c] is column 8c + order[j]."""
    nibbles = (packed.unsqueeze(-1) >> _SHIFTS) & 15  # [n, m / 8, 8] by nibble
    inverse = torch.argsort(torch.tensor(order))
    return nibbles[..., inverse].reshape(packed.shape[0], -1).to(torch.uint8)


def gptq_weight(tensors: dict[str, torch.Tensor], scheme: QuantScheme) -> WeightGrid | torch.Tensor:
    """A GPTQ module's qweight, qzeros, scales (and g_idx) -> its grid, or fp32 weights under act-order."""
    codes = unpack_rows(tensors["qweight"]).T  # [out, in]
    zeros = unpack_columns(tensors["qzeros"]).int() + scheme.zero_offset  # [groups, out]
    return _grid_or_dense(codes, zeros, tensors["scales"], tensors.get("g_idx"), scheme)


def awq_weight(tensors: dict[str, torch.Tensor], scheme: QuantScheme) -> WeightGrid | torch.Tensor:
    """An AWQ module's qweight, qzeros, scales -> its grid."""
    codes = unpack_columns(tensors["qweight"], AWQ_ORDER).T  # [out, in]
    zeros = unpack_columns(tensors["qzeros"], AWQ_ORDER).int()
    return _grid_or_dense(codes, zeros, tensors["scales"], None, scheme)


def _grid_or_dense(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                   scheme: QuantScheme) -> WeightGrid | torch.Tensor:
    out_features, in_features = codes.shape
    group = in_features if scheme.group in (-1, 0) else scheme.group
    if in_features % group or scales.shape != (in_features // group, out_features):
        raise ValueError(f"int4 scales {tuple(scales.shape)} do not fit a [{out_features}, {in_features}] weight "
                         f"in groups of {group}")
    scale = scales.float().T.contiguous()  # [out, groups]
    offset = -(zeros[:, :out_features].T.float() * scale)
    ordered = g_idx is None or torch.equal(g_idx.long(), torch.arange(in_features) // group)
    if not ordered:  # act-order: each input's own group
        g = g_idx.long()
        return codes.float() * scale[:, g] + offset[:, g]
    codes = codes.contiguous()
    if group % GROUP:
        return (codes.float().view(out_features, -1, group) * scale.unsqueeze(-1)
                + offset.unsqueeze(-1)).view(out_features, in_features)
    repeat = group // GROUP
    return WeightGrid(codes, scale.repeat_interleave(repeat, 1).contiguous(),
                      offset.repeat_interleave(repeat, 1).contiguous(), 4, GROUP)
