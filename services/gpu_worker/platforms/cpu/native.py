"""The C kernels of kernels/cpu/ for one worker: each built (or loaded from the on-disk cache) and tried once, on
first use; None where one cannot be built or run here, with a warning naming it (callers keep their torch path)."""

from __future__ import annotations

from functools import cached_property

import torch

from pagedserve.kernels.cpu.build import built_or_none
from pagedserve.kernels.cpu.fused_ops import FusedOps
from pagedserve.kernels.cpu.int8_linear import Int8Linear, pack_grid
from pagedserve.kernels.cpu.packed_linear import PackedLinear, pack_weight
from pagedserve.kernels.cpu.paged_decode import NativePagedDecode
from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill
from pagedserve.kernels.cpu.small_linear import SmallLinear
from pagedserve.kernels.cpu.weight_grid import find_grid


class NativeKernels:
    @cached_property
    def packed_linear(self) -> PackedLinear | None:
        return built_or_none("the C packed fp32 linear kernel", lambda: _tried_packed(PackedLinear()))

    @cached_property
    def int8_linear(self) -> Int8Linear | None:
        return built_or_none("the C int8 linear kernel", lambda: _tried_int8(Int8Linear()))

    @cached_property
    def small_linear(self) -> SmallLinear | None:
        return built_or_none("the C few-row linear kernel", lambda: _tried_small(SmallLinear()))

    @cached_property
    def fused_ops(self) -> FusedOps | None:
        return built_or_none("the C fused-ops kernel", FusedOps)

    @cached_property
    def paged_decode(self) -> NativePagedDecode | None:
        """Built only; the attention backend's builder tries it on the cache's dtypes."""
        return built_or_none("the C decode attention kernel", NativePagedDecode)

    @cached_property
    def paged_prefill(self) -> NativePagedPrefill | None:
        """Built only, as paged_decode."""
        return built_or_none("the C prefill attention kernel", NativePagedPrefill)


def _tried_packed(kernel: PackedLinear) -> PackedLinear:
    weight, x = torch.ones(3, 32), torch.ones(2, 32)
    for packed in (pack_weight(weight, find_codes=False), pack_weight(weight)):  # fp32 panels, 4-bit codes
        if not torch.equal(kernel(x, packed, None), torch.full((2, 3), 32.0)):
            raise RuntimeError(f"the packed linear kernel gave wrong numbers ({packed.bits}-bit weights)")
    return kernel


def _tried_int8(kernel: Int8Linear) -> Int8Linear:
    """One product whose exact value the int8 scheme reproduces: a 4-bit grid of ones (offset 1, codes 0) and
    inputs of one (each code 127, scale 1/127)."""
    out = kernel(torch.ones(2, 32), pack_grid(find_grid(torch.ones(3, 32))), None)
    if not torch.allclose(out, torch.full((2, 3), 32.0)):
        raise RuntimeError("the int8 linear kernel gave wrong numbers")
    return kernel


def _tried_small(kernel: SmallLinear) -> SmallLinear:
    for dtype in (torch.float32, torch.bfloat16):
        out = kernel(torch.ones(2, 32, dtype=dtype), torch.ones(3, 32, dtype=dtype), None)
        if not torch.equal(out.float(), torch.full((2, 3), 32.0)):
            raise RuntimeError(f"the few-row linear kernel gave wrong numbers ({dtype})")
    return kernel
