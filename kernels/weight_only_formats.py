"""Weight-only quantized layouts the Triton GEMM (weight_only_linear.py) reads; torch only, so the loader can
build them without Triton.

- Int4Weight: 4-bit codes two to a byte, `packed[o, j] = codes[o, 2j] | codes[o, 2j + 1] << 4` (uint8
  [out, in / 2], row-major: the even input in the low nibble), with fp32 `scales` and `offsets` [out, in / 32]:
  weight[o, k] = codes[o, k] * scales[o, k // 32] + offsets[o, k // 32] (a WeightGrid of 4 bits over groups of 32,
  the layout GPTQ / AWQ checkpoints unpack to; fp32 scale and offset keep their dequantization exact: 4 + 2 bits a
  weight in all).
- FP8Weight: float8_e4m3fn bit patterns as uint8 [out, in] (Triton's interpreter loads no float8 tensors; the
  kernel decodes e4m3 with bit operations) and one fp32 `scale` per output row (a per-tensor scale repeated):
  weight[o, k] = e4m3(bits[o, k]) * scale[o].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.kernels.cpu.weight_grid import GROUP, WeightGrid


@dataclass(frozen=True)
class Int4Weight:
    packed: torch.Tensor  # uint8 [out, in / 2]
    scales: torch.Tensor  # fp32 [out, in / GROUP]
    offsets: torch.Tensor  # fp32 [out, in / GROUP]

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 2

    @classmethod
    def from_grid(cls, grid: WeightGrid) -> Int4Weight:
        """The packed form of a 4-bit grid over groups of GROUP inputs."""
        if grid.bits != 4 or grid.group != GROUP:
            raise ValueError(f"an Int4Weight holds 4-bit codes over groups of {GROUP}, not {grid.bits}-bit over "
                             f"{grid.group}")
        codes = grid.codes.to(torch.uint8)
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
        return cls(packed.contiguous(), grid.scales.float().contiguous(), grid.offsets.float().contiguous())

    def to(self, device: torch.device) -> Int4Weight:
        return Int4Weight(self.packed.to(device), self.scales.to(device), self.offsets.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """weight [out, in] computed in fp32 (exact), then cast to `dtype`."""
        out_features, in_features = self.shape
        codes = torch.stack((self.packed & 15, self.packed >> 4), dim=-1).view(out_features, -1, GROUP)
        weight = codes.float() * self.scales.unsqueeze(-1) + self.offsets.unsqueeze(-1)
        return weight.view(out_features, in_features).to(dtype)


@dataclass(frozen=True)
class FP8Weight:
    bits: torch.Tensor  # uint8 [out, in]: float8_e4m3fn bit patterns
    scale: torch.Tensor  # fp32 [out]

    @property
    def shape(self) -> tuple[int, int]:
        return self.bits.shape[0], self.bits.shape[1]

    @classmethod
    def from_fp8(cls, weight: torch.Tensor, scale: torch.Tensor) -> FP8Weight:
        """float8_e4m3fn `weight` [out, in] and a per-tensor ([] / [1]) or per-row ([out] / [out, 1]) scale."""
        out_features = weight.shape[0]
        if scale.numel() not in (1, out_features):
            raise ValueError(f"an FP8Weight takes a per-tensor or per-row scale, not {tuple(scale.shape)}")
        row_scale = scale.float().reshape(-1).expand(out_features).contiguous()
        return cls(weight.contiguous().view(torch.uint8), row_scale)

    def to(self, device: torch.device) -> FP8Weight:
        return FP8Weight(self.bits.to(device), self.scale.to(device))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """weight [out, in] = e4m3 value * row scale in fp32, then cast to `dtype`."""
        return (self.bits.view(torch.float8_e4m3fn).float() * self.scale.unsqueeze(1)).to(dtype)


def concat_fp8(parts: list[FP8Weight]) -> FP8Weight:
    """Weights stacked along their rows (q|k|v, gate|up), each row keeping its scale."""
    return FP8Weight(torch.cat([p.bits for p in parts]), torch.cat([p.scale for p in parts]))
