"""Projections, with C fast paths on CPU: an fp32 GEMM on packed weights, and few-row decode steps in 16 bits.

fp32 on CPU: every projection runs through kernels/cpu/packed_linear.c on weights packed once into column panels
(at warm-up; the packed copy sits beside the weight). On the Zen 3 CI machine (AVX2, 2 threads) it takes 37 ms for all
linears of the default model at 16 rows against 55-94 ms through torch's GEMM, 90-115 ms at 64 rows against
140-165, and the same at 512; each output is one in-order sum whatever the row count, so prompt chunks use it too.
Weights that are exact 4- or 8-bit grids (the default model, dequantized from GGUF Q4_1 / Q8_0) are packed as
their codes (kernels/cpu/weight_grid.py) with the same numbers: one decode row through all of the default model's
weights takes about 10 ms instead of 16-20.

int8 inputs (`int8_activations`, the worker's default): 4-bit grid weights go to kernels/cpu/int8_linear.c instead,
which quantizes each row's inputs to int8 per 32 (llama.cpp's Q4_1 x Q8_1 scheme, with outlier inputs kept in fp32)
and multiplies in integers. On real activations of the default model, one core (Zen 3) takes 0.87 s for all of its
layer weights at 512 rows against 1.32 s for the fp32 codes, 118 ms against 176 at 64 rows, 33 against 59 at 16 and
9.1 against 12.8 for one row. Logits stay within a mean KL of about 0.001 of exact fp32; each row still gives the
same numbers whatever the row count.

16 bits: a step of one to eight decodes multiplies a few rows by every weight matrix: pure weight streaming. On
the Zen 4 CI machine (bf16, 2 threads, all 30 layers of the default model) torch's CPU GEMM takes 20-26 ms for 1-8 rows,
an Inductor-generated one-row dot-product loop 11.4 ms, and the C kernel of kernels/cpu/small_linear.c 6.6 ms
for one row (32 GB/s), 7.9 for two, 13 for four, 17 for eight. `Projector` sends up to eight rows to the C
kernel when it is built, else single rows to the compiled loop, and everything else to F.linear.

On CPUs with AVX512-BF16 or AMX, bf16 weights are also prepacked once for oneDNN (layers/prepacked.py): the same
oneDNN product as F.linear, bit for bit, without the weight reorder F.linear does on every call. Decode steps of
more than four requests use those: all weights of the default model at 8 rows in 15 ms against 28 in the C kernel
and F.linear, at 64 rows 50 against 76 through F.linear (Zen 4); up to four rows the C kernel streams the weights
faster (10 ms for one row against 14). Prompt chunks use them at any row count (512 rows: 277 ms against 293).

The few-row C kernel serves decode rows: those of decode-only steps (the model sets `decode_step` each step), and
those of a step that also holds prompt chunks when a decode-only step of as many rows would use it (the model
sets `num_decode_rows`), so a decode's numbers do not depend on prompts sharing its step. Prompt chunks go through
F.linear or its prepacked twin, whose result per row does not depend on the row count from two rows up (a lone row
is computed as two: oneDNN multiplies one row another way): a prompt computed whole and the same prompt's uncached
tail after a prefix-cache hit give the same numbers, alone or beside other requests, so identical greedy requests
give the same text. On AMX CPUs oneDNN's numbers follow the row count, so there prompt rows go in tiles of one
size (prepacked.py) and decode rows of 5+ are their own call in mixed steps as in decode-only ones (one call, not
a tile: 16 rows of all weights 10 ms against 16).
"""

from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.nn.functional as F

from kernels.cpu.build import built_or_none
from kernels.cpu.int8_linear import Int8Linear, Int8Weight, pack_grid
from kernels.cpu.int8_linear import supports as supports_int8
from kernels.cpu.packed_linear import PackedLinear, PackedWeight, pack_weight
from kernels.cpu.packed_linear import supports as supports_packed
from kernels.cpu.small_linear import MAX_ROWS, SmallLinear
from kernels.cpu.small_linear import supports as supports_small
from kernels.cpu.weight_grid import find_grid
from services.gpu_worker.compiling import compile_function
from services.gpu_worker.layers import prepacked

log = logging.getLogger(__name__)


def row_times_weight(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [1, in] @ weight[out, in].T (+ bias), accumulated in fp32."""
    out = (x.float() * weight.float()).sum(-1, keepdim=True).T
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


class Projector:
    """Calls F.linear, or on CPU the C kernels (when `native_rows` and built by warm_up: the int8 GEMM for 4-bit
    grid weights when `int8_activations`, the packed fp32 GEMM for the other fp32 weights, else the few-row one,
    and oneDNN-prepacked bf16 weights for decode steps of more than four rows on fast-bf16 CPUs) or
    the compiled single-row product (when `compile_single_row`)."""

    def __init__(self, compile_single_row: bool, native_rows: bool = False, int8_activations: bool = False) -> None:
        self.single_row = compile_function(row_times_weight, dynamic=False) if compile_single_row else None
        self.native_rows = native_rows
        self.int8_activations = int8_activations
        self.small_rows: SmallLinear | None = None  # set by warm_up
        self.packed: PackedLinear | None = None  # set by warm_up, with the packed weight of each layer
        self.packed_weights: dict[torch.nn.Module, PackedWeight] = {}
        self.int8: Int8Linear | None = None  # set by warm_up, with the layers whose weights it takes
        self.int8_weights: dict[torch.nn.Module, Int8Weight] = {}
        self.prepacked: dict[torch.nn.Module, torch.Tensor] = {}  # bf16 weights in oneDNN's layout (prepacked.py)
        self.tile_rows = 0  # > 0 (AMX CPUs): the prepacked products run in calls of this many rows (prepacked.py)
        self.decode_step = False  # set by the model before each forward: every request has one new token
        self.num_decode_rows = 0  # set by the model: the leading rows of x that are one-token requests (decodes)

    def __call__(self, x: torch.Tensor, layer: torch.nn.Module) -> torch.Tensor:
        """x [T, in] through a Linear (or a tied Embedding's weight)."""
        bias = getattr(layer, "bias", None)
        if x.dim() == 2 and (coded := self.int8_weights.get(layer)) is not None:
            return self.int8(x, coded, bias)
        if self.packed is not None and (packed := self.packed_weights.get(layer)) is not None and x.dim() == 2:
            return self.packed(x, packed, bias)
        if self.decode_step:
            return self._decode_rows(x, layer, bias)
        num_decodes = self.num_decode_rows
        if 0 < num_decodes < x.shape[0] and (
                self.tile_rows or self._few_row_kernel(x[:num_decodes], layer) is not None):
            # a mixed step: its decodes get the numbers a decode-only step of as many rows gives them, so that a
            # request's text does not depend on whether prompt chunks happened to share its steps
            return torch.cat((self._decode_rows(x[:num_decodes], layer, bias),
                              self._prompt_rows(x[num_decodes:], layer, bias)))
        return self._prompt_rows(x, layer, bias)

    def keep_rows(self, rows: torch.Tensor, num_decodes: int) -> None:
        """The model keeps only `rows` (increasing) of the step's rows from here on: count the decodes among them."""
        if self.num_decode_rows and not self.decode_step and (
                self.tile_rows or (self.small_rows or self.single_row) is not None):
            self.num_decode_rows = int((rows < num_decodes).sum())

    def _few_row_kernel(self, x: torch.Tensor, layer: torch.nn.Module):
        """The few-row kernel a decode-only step of these rows uses, or None (then the prompts' GEMM)."""
        if x.shape[0] > (prepacked.MIN_ROWS if layer in self.prepacked else MAX_ROWS):
            return None
        if self.small_rows is not None and supports_small(x, layer.weight):
            return self.small_rows
        if self.single_row is not None and x.shape[0] == 1:
            return self.single_row
        return None

    def _decode_rows(self, x: torch.Tensor, layer: torch.nn.Module, bias: torch.Tensor | None) -> torch.Tensor:
        kernel = self._few_row_kernel(x, layer)
        if kernel is not None:
            return kernel(x, layer.weight, bias)
        if self.tile_rows and layer in self.prepacked:  # AMX: decode rows in one call (a decode's numbers may
            return prepacked.prepacked_linear(x, self.prepacked[layer], bias)  # follow its batch; prompts' not)
        return self._prompt_rows(x, layer, bias)

    def _prompt_rows(self, x: torch.Tensor, layer: torch.nn.Module, bias: torch.Tensor | None) -> torch.Tensor:
        packed = self.prepacked.get(layer)
        if packed is not None and self.tile_rows:  # AMX: calls of one row count, whatever the step holds
            return prepacked.prepacked_linear(x, packed, bias, self.tile_rows)
        if x.shape[0] == 1:
            # oneDNN computes a single row another way (its K-split gemv: 2 of 17 rows of a 1536-input projection
            # differ in the last bit); as two rows it gives the row the numbers it gets among any other rows
            return self._prompt_rows(x.repeat(2, 1), layer, bias)[:1]
        if packed is not None:
            return prepacked.prepacked_linear(x, packed, bias)  # F.linear's numbers without its weight reorder
        return F.linear(x, layer.weight, bias)

    @torch.inference_mode()
    def warm_up(self, layers: list[torch.nn.Module]) -> None:
        """Build the C packed GEMM (fp32), or the C few-row kernel (16 bits; bf16 weights on fast-bf16 CPUs are also
        prepacked for oneDNN), then nothing needs compiling; else compile
        the single-row graph of each distinct weight shape up front (not in the first request). Each falls back
        with a warning."""
        if self.native_rows:
            if self._build_packed(layers):
                return
            self._prepack(layers)  # bf16 on fast-bf16 CPUs: decode steps of more than prepacked.MIN_ROWS rows
            if self._build_small_rows(layers):
                return
        if self.single_row is None:
            return
        shapes = {(tuple(layer.weight.shape), getattr(layer, "bias", None) is not None): layer for layer in layers}
        try:
            for layer in shapes.values():
                x = torch.zeros(1, layer.weight.shape[1], dtype=layer.weight.dtype, device=layer.weight.device)
                self.single_row(x, layer.weight, getattr(layer, "bias", None))
        except Exception as exc:  # a missing C++ compiler, an unsupported platform
            log.warning("torch.compile of one-row matmuls failed (%s: %s); using F.linear", type(exc).__name__, exc)
            self.single_row = None

    def _build_packed(self, layers: list[torch.nn.Module]) -> bool:
        if not layers or not all(supports_packed(layer.weight) for layer in layers):
            return False
        self.packed = built_or_none("the C packed fp32 linear kernel", lambda: _tried_packed(PackedLinear()))
        if self.packed is None:
            return False
        grids = {layer: find_grid(layer.weight) for layer in layers}
        if self.int8_activations and any(supports_int8(grid) for grid in grids.values()):
            self.int8 = built_or_none("the C int8 linear kernel", lambda: _tried_int8(Int8Linear()))
        for layer, grid in grids.items():
            if self.int8 is not None and supports_int8(grid):
                self.int8_weights[layer] = pack_grid(grid)
            else:
                self.packed_weights[layer] = pack_weight(layer.weight, grid=grid)
        _log_packing(list(self.packed_weights.values()), list(self.int8_weights.values()))
        return True

    def _prepack(self, layers: list[torch.nn.Module]) -> None:
        """bf16 weights on a fast-bf16 CPU: oneDNN-packed copies for decode steps (prepacked.py)."""
        if not layers or not all(prepacked.supported(layer.weight) for layer in layers):
            return
        try:
            self.prepacked = {layer: prepacked.tried(layer.weight) for layer in layers}
        except RuntimeError as exc:  # a torch whose oneDNN cannot pack this: self.prepacked stays empty
            log.warning("prepacked oneDNN linears are unavailable (%s); using the few-row kernel", exc)
            return
        self.tile_rows = prepacked.tile_rows()
        megabytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers) / 2**20
        log.info("prepacked %d bf16 weights for oneDNN decode steps: %.0f MiB", len(layers), megabytes)

    def _build_small_rows(self, layers: list[torch.nn.Module]) -> bool:
        weights = [layer.weight for layer in layers]
        if not weights or not all(supports_small(w[:1], w) for w in weights):
            return False
        self.small_rows = built_or_none("the C few-row linear kernel", lambda: _tried(SmallLinear(), weights[0]))
        return self.small_rows is not None


def _log_packing(packed: list[PackedWeight], int8: list[Int8Weight]) -> None:
    kinds = Counter("fp32" if weight.bits == 32 else f"{weight.bits}-bit codes" for weight in packed)
    kinds.update({"4-bit codes x int8 inputs": len(int8)} if int8 else {})
    megabytes = sum(weight.nbytes() for weight in [*packed, *int8]) / 2**20
    log.info("packed %d weights for the C GEMMs (%s): %.0f MiB", len(packed) + len(int8),
             ", ".join(f"{count} as {kind}" for kind, count in sorted(kinds.items())), megabytes)


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


def _tried(kernel: SmallLinear, weight: torch.Tensor) -> SmallLinear:
    kernel(torch.zeros(2, weight.shape[1], dtype=weight.dtype), weight, None)
    return kernel
