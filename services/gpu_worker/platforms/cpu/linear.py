"""The CPU platform's linear kernels, chosen per layer at load.

fp32 weights go to the C GEMMs of kernels/cpu on weights packed once: the int8 GEMM for exact 4-bit grids and 8-bit
ones (GGUF Q5_0 / Q5_1 / Q5_K / Q8_0 / Q6_K codes; those whose codes fit 5 bits, GGUF Q5_x, packed as 5-bit codes)
when `int8_activations` (inputs quantized to int8 per row and 32 inputs), else the packed fp32 GEMM (grids packed as
their codes). Each output is one in-order sum whatever the row count, so every row gets the same numbers in any
step.

16-bit weights: a row's numbers may depend on the product that computes it, so rows are routed by the step's
StepRows. Prompt rows take the prompt product, whose per-row result depends on nothing else in the call: F.linear
or its oneDNN-prepacked twin (prepacked.py; a lone row as two, tiles of one size on AMX). Decode rows take the
few-row product a decode-only step of as many rows takes (the C few-row kernel, or a compiled one-row loop), in
decode-only and mixed steps alike, so that a decode's numbers do not depend on prompts sharing its step; more
decode rows than it serves go to the prompt product (on AMX: one untiled prepacked call).

In batch-invariant mode every row takes the prompt product: a row's numbers then depend only on the row, whether
it is a decode, a prompt row or a recomputed one after preemption.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.kernels.cpu.int8_linear import Int8Linear, Int8Weight, pack_grid
from pagedserve.kernels.cpu.int8_linear import supports as supports_int8
from pagedserve.kernels.cpu.packed_linear import PackedLinear, PackedWeight, pack_weight
from pagedserve.kernels.cpu.packed_linear import supports as supports_packed
from pagedserve.kernels.cpu.small_linear import MAX_ROWS, SmallLinear
from pagedserve.kernels.cpu.small_linear import supports as supports_small
from pagedserve.kernels.cpu.weight_grid import find_grid
from pagedserve.services.gpu_worker.compiling import compile_function
from pagedserve.services.gpu_worker.layers.linear import Linear, Product, at_least_two_rows
from pagedserve.services.gpu_worker.platforms.cpu import prepacked
from pagedserve.services.gpu_worker.platforms.cpu.native import NativeKernels
from pagedserve.services.gpu_worker.step_rows import StepRows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinearOptions:
    native_kernels: bool = True  # the C kernels of kernels/cpu
    torch_compile: bool = True  # a compiled one-row product for 16-bit decodes where the C few-row kernel is off
    int8_activations: bool = False  # 4- and 8-bit grid weights multiply int8-quantized inputs
    batch_invariant: bool = False  # every row through the prompt product


@dataclass(frozen=True)
class CGemmLinear:
    """A fp32 layer on one of the C GEMMs: every row gets the same numbers whatever the row count."""

    gemm: PackedLinear | Int8Linear
    weight: PackedWeight | Int8Weight
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return self.gemm(x, self.weight, self.bias)


@dataclass(frozen=True)
class RoutedLinear:
    """A layer whose product for a row may depend on the rows beside it: decode rows and prompt rows routed apart.

    `prompt` gives a row the same numbers at any row count; `few_rows` (up to `max_few_rows` rows) and
    `many_decodes` (beyond) are what decode rows take instead, None where they take `prompt` too."""

    prompt: Product
    few_rows: Product | None = None
    max_few_rows: int = 0
    many_decodes: Product | None = None

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        n = rows.num_decodes
        route = self._decode_route(n) if n else None
        if route is None:
            return self.prompt(x)
        if n == x.shape[0]:
            return route(x)
        return torch.cat((route(x[:n]), self.prompt(x[n:])))

    def _decode_route(self, num_decodes: int) -> Product | None:
        if self.few_rows is not None and num_decodes <= self.max_few_rows:
            return self.few_rows
        return self.many_decodes


def bind_linears(layers: list[Linear], native: NativeKernels | None, options: LinearOptions) -> None:
    """Give each layer its kernel; a fast path that cannot be built falls back with a warning."""
    if native is not None and _bind_c_gemms(layers, native, options.int8_activations):
        return
    packed = _prepacked(layers) if native is not None else {}
    tile = prepacked.tile_rows() if packed else 0
    if options.batch_invariant and not packed:
        raise ValueError("--batch-invariant needs the C GEMMs (fp32 models) or bf16 weights prepacked for oneDNN "
                         "(a CPU with AVX512-BF16 or AMX), whose numbers for a row do not depend on the rows beside "
                         "it; this model's linears get neither here")
    if options.batch_invariant:
        for layer in layers:
            layer.kernel = RoutedLinear(_prompt_product(layer, packed.get(layer), tile))
        return
    few_rows, max_rows = _few_row_products(layers, native, options.torch_compile, bool(packed))
    for layer in layers:
        weight, bias, packed_weight = layer.weight, layer.bias, packed.get(layer)
        many = None
        if tile and packed_weight is not None:  # AMX: decode rows in one untiled call (prompts' are tiled)
            many = _bound(prepacked.prepacked_linear, packed_weight, bias)
        few = None if few_rows is None else _bound(few_rows, weight, bias)
        layer.kernel = RoutedLinear(_prompt_product(layer, packed_weight, tile), few, max_rows, many)


def _bound(fn, weight, bias) -> Product:
    return lambda x: fn(x, weight, bias)


def _prompt_product(layer: Linear, packed: torch.Tensor | None, tile: int) -> Product:
    """The layer's product whose numbers for a row do not depend on the rows beside it."""
    bias = layer.bias
    if packed is not None and tile:
        return lambda x: prepacked.prepacked_linear(x, packed, bias, tile)
    if packed is not None:
        return at_least_two_rows(lambda x: prepacked.prepacked_linear(x, packed, bias))
    weight = layer.weight
    return at_least_two_rows(lambda x: F.linear(x, weight, bias))


def _bind_c_gemms(layers: list[Linear], native: NativeKernels, int8_activations: bool) -> bool:
    """fp32: every layer on the packed GEMM or (4- and 8-bit grids, int8_activations) the int8 one; False where not all
    layers can be. A layer's grid is the checkpoint's (Linear.grid, then dropped) or found in its weight."""
    if not layers or not all(layer.grid is not None or supports_packed(layer.weight) for layer in layers):
        return False
    if native.packed_linear is None:
        return False
    grids = {layer: layer.grid if layer.grid is not None else find_grid(layer.weight) for layer in layers}
    int8 = native.int8_linear if int8_activations and any(map(supports_int8, grids.values())) else None
    for layer, grid in grids.items():
        if int8 is not None and supports_int8(grid):
            layer.kernel = CGemmLinear(int8, pack_grid(grid), layer.bias)
        else:
            layer.kernel = CGemmLinear(native.packed_linear, pack_weight(layer.weight, grid=grid), layer.bias)
        layer.grid = None  # the packed copy replaces it
    _log_packing([layer.kernel.weight for layer in layers])
    return True


def _prepacked(layers: list[Linear]) -> dict[Linear, torch.Tensor]:
    """bf16 weights on a fast-bf16 CPU: their oneDNN-prepacked copies (none where any layer cannot be)."""
    if not layers or not all(prepacked.supported(layer.weight) for layer in layers):
        return {}
    try:
        packed = {layer: prepacked.tried(layer.weight) for layer in layers}
    except RuntimeError as exc:  # a torch whose oneDNN cannot pack this
        log.warning("prepacked oneDNN linears are unavailable (%s); using F.linear", exc)
        return {}
    megabytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers) / 2**20
    log.info("prepacked %d bf16 weights for oneDNN: %.0f MiB", len(layers), megabytes)
    return packed


def _few_row_products(layers: list[Linear], native: NativeKernels | None, torch_compile: bool,
                      prepacked_weights: bool) -> tuple[SmallLinear | Callable | None, int]:
    """(the product decode-only steps of few rows take, how many rows it serves), or (None, 0)."""
    weights = [layer.weight for layer in layers]
    if native is not None and weights and all(supports_small(w[:1], w) for w in weights):
        if native.small_linear is not None:
            return native.small_linear, prepacked.MIN_ROWS if prepacked_weights else MAX_ROWS
    if torch_compile and weights:
        single_row = _compiled_single_row(layers)
        if single_row is not None:
            return single_row, 1
    return None, 0


def row_times_weight(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, in] @ weight[out, in].T (+ bias), accumulated in fp32."""
    out = (x.float() * weight.float()).sum(-1, keepdim=True).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def _compiled_single_row(layers: list[Linear]) -> Callable | None:
    """row_times_weight compiled for each distinct weight shape up front (not in the first request); None with a
    warning where compiling fails."""
    single_row = compile_function(row_times_weight, dynamic=False)
    shapes = {(tuple(layer.weight.shape), layer.bias is not None): layer for layer in layers}
    try:
        for layer in shapes.values():
            x = torch.zeros(1, layer.weight.shape[1], dtype=layer.weight.dtype, device=layer.weight.device)
            single_row(x, layer.weight, layer.bias)
    except Exception as exc:  # a missing C++ compiler, an unsupported platform
        log.warning("torch.compile of one-row matmuls failed (%s: %s); using F.linear", type(exc).__name__, exc)
        return None
    return single_row


def _log_packing(weights: list[PackedWeight | Int8Weight]) -> None:
    kinds = Counter(f"{w.bits}-bit codes x int8 inputs" if isinstance(w, Int8Weight) else
                    "fp32" if w.bits == 32 else f"{w.bits}-bit codes" for w in weights)
    megabytes = sum(weight.nbytes() for weight in weights) / 2**20
    log.info("packed %d weights for the C GEMMs (%s): %.0f MiB", len(weights),
             ", ".join(f"{count} as {kind}" for kind, count in sorted(kinds.items())), megabytes)
