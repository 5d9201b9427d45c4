"""The CPU platform's linear kernels: fp32 through the packed or int8 C GEMM, 16-bit decode rows through the few-row
C kernel or the compiled one-row loop, prompt rows through F.linear or its oneDNN-prepacked twin, all equal to
F.linear; each fast path falls back when it cannot be built. Routes that depend on the CPU (fast bf16, AMX) run on
every CPU: the CPU's flags are faked, and only a oneDNN that cannot run a route at all skips it, with the reason."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

import pagedserve.services.gpu_worker.platforms.cpu.native as native_module
from pagedserve.kernels.cpu.build import KernelBuildError
from pagedserve.kernels.cpu.int8_linear import Int8Linear, pack_grid
from pagedserve.kernels.cpu.packed_linear import PackedLinear, pack_weight
from pagedserve.kernels.cpu.small_linear import MAX_ROWS
from pagedserve.kernels.cpu.weight_grid import find_grid
from pagedserve.services.gpu_worker.layers.linear import Linear
from pagedserve.services.gpu_worker.platforms.cpu import prepacked
from pagedserve.services.gpu_worker.platforms.cpu.cpu_flags import cpu_has_amx
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear, LinearOptions, RoutedLinear, bind_linears
from pagedserve.services.gpu_worker.platforms.cpu.native import NativeKernels
from pagedserve.services.gpu_worker.step_rows import StepRows
from tests.kernels.test_cpu_packed_linear import grid_weight

# CPU kinds by the flags the platform reads: (fast bf16, AMX)
CPU_KINDS = {"avx2": (False, False), "avx512_bf16": (True, False), "amx": (True, True)}


def make_linear(in_features: int, out_features: int, bias: bool = True, dtype: torch.dtype = torch.float32,
                weight: torch.Tensor | None = None, seed: int = 0) -> Linear:
    """A Linear with real parameters (as the loader leaves it)."""
    torch.manual_seed(seed)
    layer = Linear(in_features, out_features, bias, dtype)
    values = torch.randn(out_features, in_features) * 0.05 if weight is None else weight
    layer.weight = torch.nn.Parameter(values.to(dtype), requires_grad=False)
    if bias:
        layer.bias = torch.nn.Parameter(torch.randn(out_features).to(dtype), requires_grad=False)
    return layer


def bind(layers: list[Linear], native_kernels: bool = True, **options) -> NativeKernels | None:
    native = NativeKernels() if native_kernels else None
    bind_linears(layers, native, LinearOptions(native_kernels=native_kernels, **options))
    return native


def set_cpu_kind(monkeypatch, kind: str) -> None:
    """Make the platform see a CPU of `kind`; skip (with the reason) where this CPU's oneDNN cannot run the bf16
    products that kind takes."""
    fast, amx = CPU_KINDS[kind]
    monkeypatch.setattr(prepacked, "cpu_has_fast_bf16", lambda: fast)
    monkeypatch.setattr(prepacked, "cpu_has_amx", lambda: amx)
    if fast:
        try:
            prepacked.tried(torch.randn(16, 32, dtype=torch.bfloat16))
        except RuntimeError as exc:
            pytest.skip(f"oneDNN here cannot run bf16 prepacked products ({exc}), which a {kind} CPU takes")


def require_row_count_independent_onednn(kind: str) -> None:
    """oneDNN picks AMX kernels on an AMX CPU whatever flags the platform is shown, and then untiled products
    follow the row count: claims about untiled products hold only where oneDNN does not use AMX."""
    _, amx = CPU_KINDS[kind]
    if not amx and cpu_has_amx():
        pytest.skip(f"this CPU has AMX: oneDNN's untiled bf16 products follow the row count here, whatever a {kind} "
                    "platform is shown (the amx kind covers this CPU)")


@pytest.fixture(params=list(CPU_KINDS))
def cpu_kind(request, monkeypatch) -> str:
    set_cpu_kind(monkeypatch, request.param)
    return request.param


def check(layer: Linear, rows: StepRows, atol: float) -> torch.Tensor:
    x = torch.randn(rows.num_rows, layer.in_features, dtype=layer.weight.dtype)
    with torch.inference_mode():
        out = layer(x, rows)
    assert out.shape == (rows.num_rows, layer.out_features) and out.dtype == layer.weight.dtype
    torch.testing.assert_close(out.float(), F.linear(x, layer.weight, layer.bias).float(), atol=atol, rtol=0)
    return out


def decodes(n: int) -> StepRows:
    return StepRows(n, n)


def prompt_rows(n: int) -> StepRows:
    return StepRows(n, 0)


def spy(calls: list, fn):
    return lambda x, *args: calls.append(len(x)) or fn(x, *args)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_compiled_single_row_matches_linear(dtype: torch.dtype, atol: float, bias: bool) -> None:
    layer = make_linear(96, 40, bias, dtype)
    bind([layer], native_kernels=False, torch_compile=True)
    assert isinstance(layer.kernel, RoutedLinear) and layer.kernel.max_few_rows == 1  # compiled, no fall-back
    for rows in (1, 3):
        check(layer, decodes(rows), atol)


def test_fp32_goes_through_the_packed_kernel_for_any_row_count() -> None:
    layer = make_linear(96, 40, seed=2)
    bind([layer], torch_compile=True)
    kernel = layer.kernel
    assert isinstance(kernel, CGemmLinear) and isinstance(kernel.gemm, PackedLinear) and kernel.weight.bits == 32
    calls = []
    layer.kernel = dataclasses.replace(kernel, gemm=spy(calls, kernel.gemm))
    for rows in (decodes, prompt_rows):
        for n in (1, 9, 40):
            check(layer, rows(n), 1e-4)
    assert calls == [1, 9, 40] * 2


def test_weights_on_a_grid_are_packed_as_codes(caplog) -> None:
    """A layer dequantized from a 4-bit checkpoint is packed as codes, with the fp32 panels' numbers."""
    coded = make_linear(64, 48, bias=False, weight=grid_weight(48, 64, GGMLQuantizationType.Q4_1))
    plain = make_linear(64, 48)
    with caplog.at_level(logging.INFO):
        bind([coded, plain])
    assert coded.kernel.weight.bits == 4 and plain.kernel.weight.bits == 32
    assert "packed 2 weights for the C GEMMs (1 as 4-bit codes, 1 as fp32)" in caplog.text
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(coded(x, prompt_rows(3)),
                           coded.kernel.gemm(x, pack_weight(coded.weight, find_codes=False), None))
    check(coded, decodes(1), 1e-4)


def test_4_bit_grid_weights_take_int8_inputs_when_asked(caplog) -> None:
    """int8_activations: the 4-bit grid layer goes to the int8 kernel, a plain fp32 one to the packed GEMM."""
    coded = make_linear(64, 48, weight=grid_weight(48, 64, GGMLQuantizationType.Q4_1))
    plain = make_linear(64, 48)
    with caplog.at_level(logging.INFO):
        bind([coded, plain], int8_activations=True)
    assert isinstance(coded.kernel.gemm, Int8Linear) and isinstance(plain.kernel.gemm, PackedLinear)
    assert plain.kernel.weight.bits == 32
    assert "packed 2 weights for the C GEMMs (1 as 4-bit codes x int8 inputs, 1 as fp32)" in caplog.text
    torch.manual_seed(4)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        out = coded(x, prompt_rows(5))
        assert torch.equal(out, coded.kernel.gemm(x, pack_grid(find_grid(coded.weight)), coded.bias))
        exact = F.linear(x, coded.weight, coded.bias)
        assert (out - exact).norm() < 0.02 * exact.norm()
    check(plain, decodes(3), 1e-4)


def no_compiler():
    raise KernelBuildError("no C compiler found")


def test_int8_falls_back_to_the_packed_codes(monkeypatch, caplog) -> None:
    monkeypatch.setattr(native_module, "Int8Linear", no_compiler)
    coded = make_linear(64, 16, bias=False, weight=grid_weight(16, 64, GGMLQuantizationType.Q4_1))
    with caplog.at_level(logging.WARNING):
        bind([coded], int8_activations=True)
    assert "int8 linear kernel is unavailable" in caplog.text
    assert isinstance(coded.kernel.gemm, PackedLinear) and coded.kernel.weight.bits == 4
    check(coded, decodes(2), 1e-4)


def test_few_16_bit_decode_rows_go_through_the_c_kernel(monkeypatch) -> None:
    set_cpu_kind(monkeypatch, "avx2")  # nothing prepacked: the C kernel for every few-row count
    layer = make_linear(96, 40, dtype=torch.bfloat16, seed=1)
    bind([layer], torch_compile=True)
    kernel = layer.kernel
    assert kernel.max_few_rows == MAX_ROWS and kernel.many_decodes is None
    calls = []
    layer.kernel = dataclasses.replace(kernel, few_rows=spy(calls, kernel.few_rows))
    for rows in (1, 5, 8, 9, 40):
        check(layer, decodes(rows), 3e-2)
    assert calls == [1, 5, 8]  # 9 and more rows: F.linear


def test_falls_back_to_the_compiled_row_when_the_kernels_cannot_build(monkeypatch, caplog) -> None:
    monkeypatch.setattr(native_module, "SmallLinear", no_compiler)
    monkeypatch.setattr(native_module, "PackedLinear", no_compiler)
    layer = make_linear(32, 8)
    with caplog.at_level(logging.WARNING):
        bind([layer], torch_compile=True)
    assert isinstance(layer.kernel, RoutedLinear) and layer.kernel.max_few_rows == 1
    assert "packed fp32 linear kernel is unavailable" in caplog.text
    assert "few-row linear kernel is unavailable" in caplog.text
    check(layer, decodes(1), 1e-5)


def test_16_bit_prompt_rows_never_use_the_few_row_paths(cpu_kind: str) -> None:
    """Prompt rows, even a lone one, go to F.linear or its prepacked twin (row-count independent numerics)."""
    layer = make_linear(32, 8, dtype=torch.bfloat16)
    bind([layer], torch_compile=True)
    layer.kernel = dataclasses.replace(layer.kernel, few_rows=lambda x: pytest.fail("a few-row path ran"))
    check(layer, prompt_rows(1), 2e-2)


def test_a_head_tied_to_the_embedding() -> None:
    embedding = torch.nn.Embedding(50, 16).requires_grad_(False)
    for native_kernels in (False, True):
        head = make_linear(16, 50, bias=False, weight=embedding.weight)
        bind([head], native_kernels=native_kernels, torch_compile=True)
        hidden = torch.randn(1, 16)
        with torch.inference_mode():
            out = head(hidden, decodes(1))
        torch.testing.assert_close(out, hidden @ embedding.weight.T, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["avx512_bf16", "amx"])
def test_bf16_decode_steps_of_more_than_four_rows_use_prepacked_weights(monkeypatch, kind: str) -> None:
    """On fast-bf16 CPUs bf16 weights are prepacked for oneDNN and serve decode steps of 5+ rows (1-4: the C
    kernel) and prompt rows of any count, the latter F.linear bit for bit."""
    set_cpu_kind(monkeypatch, kind)
    few_calls, packed_calls = [], []
    monkeypatch.setattr(prepacked, "prepacked_linear", spy(packed_calls, prepacked.prepacked_linear))
    layer = make_linear(96, 40, dtype=torch.bfloat16, seed=2)
    bind([layer])
    kernel = layer.kernel
    assert kernel.max_few_rows == prepacked.MIN_ROWS
    layer.kernel = dataclasses.replace(kernel, few_rows=spy(few_calls, kernel.few_rows))
    packed_calls.clear()  # the check at binding
    for rows in (1, 4, 5, 8, 64):
        check(layer, decodes(rows), 3e-2)
    assert few_calls == [1, 4] and len(packed_calls) == 3  # 5 and more rows: the prepacked weight
    for rows in (1, 3, 8, 300):
        x = torch.randn(rows, 96, dtype=torch.bfloat16)
        with torch.inference_mode():
            assert torch.equal(layer(x, prompt_rows(rows)), F.linear(x, layer.weight, layer.bias))
    assert few_calls == [1, 4] and len(packed_calls) == 7


def test_nothing_is_prepacked_without_fast_bf16(monkeypatch) -> None:
    set_cpu_kind(monkeypatch, "avx2")
    layer = make_linear(96, 40, dtype=torch.bfloat16)
    monkeypatch.setattr(prepacked, "prepack", lambda weight: pytest.fail("prepacked without fast bf16"))
    bind([layer])
    assert layer.kernel.max_few_rows == MAX_ROWS and layer.kernel.many_decodes is None


@pytest.mark.parametrize("cpu_kind", ["avx512_bf16", "amx"])
@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (200, 576)])
def test_prepacked_weights_give_the_same_numbers_at_every_row_count(monkeypatch, shape, cpu_kind: str) -> None:
    """A row's outputs do not depend on how many other rows share the call, from two rows up (a lone row is the
    caller's business). With AMX oneDNN's own numbers follow the row count (a 1536-input projection's rows differ
    at 45-69 rows), so there the calls go in tiles of one size: prepacked.tile_rows()."""
    set_cpu_kind(monkeypatch, cpu_kind)
    require_row_count_independent_onednn(cpu_kind)
    torch.manual_seed(3)
    weight = torch.randn(*shape, dtype=torch.bfloat16) * 0.05
    assert not prepacked.supported(weight.float())  # fp32 weights never take this path
    packed, tile = prepacked.tried(weight), prepacked.tile_rows()
    assert tile == (prepacked.TILE_ROWS if cpu_kind == "amx" else 0)
    x = torch.randn(64, shape[1], dtype=torch.bfloat16)
    together = prepacked.prepacked_linear(x, packed, None, tile)
    for rows in (2, 5, 9, 14, 20, 33, 45, 50, 63):
        assert torch.equal(prepacked.prepacked_linear(x[:rows], packed, None, tile), together[:rows]), rows


def test_tiled_prepacked_products_depend_only_on_each_row(monkeypatch) -> None:
    """In tiles of one size (the last padded) a row gets the same numbers at any row count, at any place."""
    set_cpu_kind(monkeypatch, "amx")
    torch.manual_seed(5)
    weight = torch.randn(576, 1536, dtype=torch.bfloat16) * 0.05
    packed = prepacked.tried(weight)
    x = torch.randn(200, 1536, dtype=torch.bfloat16)
    together = prepacked.prepacked_linear(x, packed, None, 64)
    torch.testing.assert_close(together, F.linear(x, weight), atol=2e-2, rtol=2e-2)
    for start, rows in ((0, 1), (0, 64), (0, 65), (7, 130), (150, 50)):
        part = prepacked.prepacked_linear(x[start: start + rows], packed, None, 64)
        assert torch.equal(part, together[start: start + rows]), (start, rows)


def test_amx_cpus_tile_prompt_rows_and_give_decodes_one_call(cpu_kind: str) -> None:
    layer = make_linear(96, 40, bias=False, dtype=torch.bfloat16)
    bind([layer])
    assert (layer.kernel.many_decodes is not None) is (cpu_kind == "amx")


def test_a_one_row_prompt_chunk_gets_the_numbers_it_gets_among_other_rows(cpu_kind: str) -> None:
    """oneDNN multiplies a lone row another way (some rows of a 1536-input bf16 projection differ in the last bit),
    so a prompt whose last layer keeps one row would get other logits beside another request than alone; the
    prompt product computes a lone row as two."""
    require_row_count_independent_onednn(cpu_kind)
    layer = make_linear(1536, 576, bias=False, dtype=torch.bfloat16, seed=4)
    bind([layer])
    x = torch.randn(64, 1536, dtype=torch.bfloat16)
    with torch.inference_mode():
        together = layer(x, prompt_rows(64))
        alone = torch.cat([layer(x[r: r + 1], prompt_rows(1)) for r in range(64)])
    assert torch.equal(alone, together)


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576)])
def test_decode_rows_of_a_mixed_step_get_their_decode_only_numbers(shape, cpu_kind: str) -> None:
    """Decode rows beside prompt rows get what a decode-only step of as many rows gives them, and the prompt rows
    what they get alone, whatever route each takes on this kind of CPU (the few-row kernel, tiles on AMX, one
    call)."""
    require_row_count_independent_onednn(cpu_kind)
    layer = make_linear(shape[1], shape[0], bias=False, dtype=torch.bfloat16, seed=6)
    bind([layer])
    x = torch.randn(60, shape[1], dtype=torch.bfloat16)
    with torch.inference_mode():
        for num_decodes in (3, 20, 47):
            mixed = layer(x, StepRows(60, num_decodes))
            prompts = layer(x[num_decodes:], prompt_rows(60 - num_decodes))
            only_decodes = layer(x[:num_decodes], decodes(num_decodes))
            assert torch.equal(mixed[:num_decodes], only_decodes), num_decodes
            assert torch.equal(mixed[num_decodes:], prompts), num_decodes


@pytest.mark.parametrize(("dtype", "kind"), [(torch.float32, "avx2"), (torch.bfloat16, "avx512_bf16"),
                                           (torch.bfloat16, "amx")])
def test_batch_invariant_rows_get_one_product_whatever_shares_the_call(monkeypatch, dtype: torch.dtype,
                                                                       kind: str) -> None:
    """Batch-invariant mode: a row's numbers are the same as a decode, a prompt row or a recomputed one, alone or
    beside any rows (fp32: the C GEMMs; bf16: the prepacked product, on fast-bf16 CPUs of either kind)."""
    set_cpu_kind(monkeypatch, kind)
    require_row_count_independent_onednn(kind)
    layer = make_linear(1536, 576, dtype=dtype, seed=7)
    bind([layer], batch_invariant=True)
    x = torch.randn(70, 1536, dtype=dtype)
    with torch.inference_mode():
        reference = torch.cat([layer(x[r: r + 1], prompt_rows(1)) for r in range(70)])
        for rows in (decodes(70), prompt_rows(70), StepRows(70, 3), StepRows(70, 30)):
            assert torch.equal(layer(x, rows), reference), rows
        for n in (1, 2, 4, 8):
            assert torch.equal(layer(x[:n], decodes(n)), reference[:n]), n


def test_batch_invariant_16_bit_needs_prepacked_weights(monkeypatch) -> None:
    set_cpu_kind(monkeypatch, "avx2")
    with pytest.raises(ValueError, match="--batch-invariant needs"):
        bind([make_linear(32, 8, dtype=torch.bfloat16)], batch_invariant=True)
