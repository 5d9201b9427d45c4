"""The Projector: fp32 through the packed C GEMM, 16-bit few-row products through the C kernel or the compiled
one-row loop, all equal to F.linear; larger 16-bit inputs go to F.linear; each fast path falls back when it cannot
be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from torch import nn

import services.gpu_worker.layers.linear as linear
from kernels.cpu.build import KernelBuildError
from kernels.cpu.int8_linear import pack_grid
from kernels.cpu.packed_linear import pack_weight
from kernels.cpu.weight_grid import find_grid
from services.gpu_worker.layers import prepacked
from services.gpu_worker.layers.linear import Projector
from tests.kernels.test_cpu_packed_linear import grid_weight


def _check(proj: Projector, layer: nn.Linear, rows: int, atol: float) -> None:
    x = torch.randn(rows, layer.in_features, dtype=layer.weight.dtype)
    out = proj(x, layer)
    assert out.shape == (rows, layer.out_features) and out.dtype == layer.weight.dtype
    torch.testing.assert_close(out.float(), F.linear(x, layer.weight, layer.bias).float(), atol=atol, rtol=0)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("bias", [False, True])
def test_single_row_matches_linear(dtype: torch.dtype, atol: float, bias: bool) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(96, 40, bias=bias, dtype=dtype).requires_grad_(False)
    proj = Projector(compile_single_row=True)
    proj.warm_up([layer])
    assert proj.single_row is not None and proj.small_rows is None  # compiled, no fall-back
    proj.decode_step = True
    with torch.inference_mode():
        for rows in (1, 3):
            _check(proj, layer, rows, atol)


def test_fp32_goes_through_the_packed_kernel_for_any_row_count() -> None:
    torch.manual_seed(2)
    layer = nn.Linear(96, 40).requires_grad_(False)
    proj = Projector(compile_single_row=True, native_rows=True)
    proj.warm_up([layer])
    assert proj.packed is not None and layer in proj.packed_weights and proj.small_rows is None
    calls = []
    kernel = proj.packed
    proj.packed = lambda *args: calls.append(len(args[0])) or kernel(*args)
    with torch.inference_mode():
        for decode_step in (True, False):
            proj.decode_step = decode_step
            for rows in (1, 9, 40):
                _check(proj, layer, rows, 1e-4)
    assert calls == [1, 9, 40] * 2


def test_weights_on_a_grid_are_packed_as_codes(caplog) -> None:
    """A layer dequantized from a 4-bit checkpoint is packed as codes, with the fp32 panels' numbers."""
    coded = nn.Linear(64, 48, bias=False).requires_grad_(False)
    coded.weight.copy_(grid_weight(48, 64, GGMLQuantizationType.Q4_1))
    plain = nn.Linear(64, 48).requires_grad_(False)
    proj = Projector(compile_single_row=False, native_rows=True)
    with caplog.at_level(logging.INFO):
        proj.warm_up([coded, plain])
    assert proj.packed_weights[coded].bits == 4 and proj.packed_weights[plain].bits == 32
    assert "packed 2 weights for the C GEMMs (1 as 4-bit codes, 1 as fp32)" in caplog.text
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(proj(x, coded), proj.packed(x, pack_weight(coded.weight, find_codes=False), None))
        _check(proj, coded, 1, 1e-4)


def test_4_bit_grid_weights_take_int8_inputs_when_asked(caplog) -> None:
    """int8_activations: the 4-bit grid layer goes to the int8 kernel, a plain fp32 one to the packed GEMM."""
    coded = nn.Linear(64, 48).requires_grad_(False)
    coded.weight.copy_(grid_weight(48, 64, GGMLQuantizationType.Q4_1))
    plain = nn.Linear(64, 48).requires_grad_(False)
    proj = Projector(compile_single_row=False, native_rows=True, int8_activations=True)
    with caplog.at_level(logging.INFO):
        proj.warm_up([coded, plain])
    assert list(proj.int8_weights) == [coded] and proj.packed_weights[plain].bits == 32
    assert "packed 2 weights for the C GEMMs (1 as 4-bit codes x int8 inputs, 1 as fp32)" in caplog.text
    torch.manual_seed(4)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        out = proj(x, coded)
        assert torch.equal(out, proj.int8(x, pack_grid(find_grid(coded.weight)), coded.bias))
        exact = F.linear(x, coded.weight, coded.bias)
        assert (out - exact).norm() < 0.02 * exact.norm()
        _check(proj, plain, 3, 1e-4)


def test_int8_falls_back_to_the_packed_codes(monkeypatch, caplog) -> None:
    def no_compiler():
        raise KernelBuildError("no C compiler found")

    monkeypatch.setattr(linear, "Int8Linear", no_compiler)
    coded = nn.Linear(64, 16, bias=False).requires_grad_(False)
    coded.weight.copy_(grid_weight(16, 64, GGMLQuantizationType.Q4_1))
    proj = Projector(compile_single_row=False, native_rows=True, int8_activations=True)
    with caplog.at_level(logging.WARNING):
        proj.warm_up([coded])
    assert "int8 linear kernel is unavailable" in caplog.text
    assert proj.int8 is None and not proj.int8_weights and proj.packed_weights[coded].bits == 4
    with torch.inference_mode():
        _check(proj, coded, 2, 1e-4)


def test_few_16_bit_rows_go_through_the_c_kernel(monkeypatch) -> None:
    monkeypatch.setattr(prepacked, "supported", lambda weight: False)  # the C kernel for every few-row count
    torch.manual_seed(1)
    layer = nn.Linear(96, 40, dtype=torch.bfloat16).requires_grad_(False)
    atol = 3e-2
    proj = Projector(compile_single_row=True, native_rows=True)
    proj.warm_up([layer])
    assert proj.small_rows is not None and proj.packed is None
    proj.decode_step = True
    calls = []
    kernel = proj.small_rows
    proj.small_rows = lambda *args: calls.append(len(args[0])) or kernel(*args)
    with torch.inference_mode():
        for rows in (1, 5, 8, 9, 40):
            _check(proj, layer, rows, atol)
    assert calls == [1, 5, 8]  # 9 and more rows: F.linear


def test_falls_back_to_the_compiled_row_when_the_kernel_cannot_build(monkeypatch, caplog) -> None:
    def no_compiler():
        raise KernelBuildError("no C compiler found")

    monkeypatch.setattr(linear, "SmallLinear", no_compiler)
    monkeypatch.setattr(linear, "PackedLinear", no_compiler)
    layer = nn.Linear(32, 8).requires_grad_(False)
    proj = Projector(compile_single_row=True, native_rows=True)
    with caplog.at_level(logging.WARNING):
        proj.warm_up([layer])
    assert proj.small_rows is None and proj.packed is None and proj.single_row is not None
    assert "packed fp32 linear kernel is unavailable" in caplog.text
    assert "few-row linear kernel is unavailable" in caplog.text
    proj.decode_step = True
    with torch.inference_mode():
        _check(proj, layer, 1, 1e-5)


def test_16_bit_prompt_chunks_never_use_the_few_row_paths() -> None:
    """Outside decode steps even one row goes to F.linear or its prepacked twin (row-count independent numerics
    for prompts)."""
    layer = nn.Linear(32, 8, dtype=torch.bfloat16).requires_grad_(False)
    proj = Projector(compile_single_row=True, native_rows=True)
    proj.warm_up([layer])
    proj.small_rows = proj.single_row = lambda *args: pytest.fail("a fast path ran outside a decode step")
    with torch.inference_mode():
        _check(proj, layer, 1, 2e-2)


def test_tied_embedding_head() -> None:
    embedding = nn.Embedding(50, 16).requires_grad_(False)
    for proj in (Projector(compile_single_row=True), Projector(compile_single_row=False, native_rows=True)):
        proj.warm_up([embedding])
        proj.decode_step = True
        with torch.inference_mode():
            hidden = torch.randn(1, 16)
            torch.testing.assert_close(proj(hidden, embedding), hidden @ embedding.weight.T, atol=1e-5, rtol=0)


def test_bf16_decode_steps_of_more_than_four_rows_use_prepacked_weights_on_fast_bf16_cpus() -> None:
    """Where the CPU has fast bf16, bf16 weights are prepacked for oneDNN and serve decode steps of 5+ rows (1-4:
    the C kernel); elsewhere nothing is prepacked. Either way every path equals F.linear within bf16 rounding."""
    torch.manual_seed(2)
    layer = nn.Linear(96, 40, dtype=torch.bfloat16).requires_grad_(False)
    proj = Projector(compile_single_row=False, native_rows=True)
    proj.warm_up([layer])
    assert proj.small_rows is not None
    if not prepacked.supported(layer.weight):
        assert not proj.prepacked
        return
    assert set(proj.prepacked) == {layer}
    proj.decode_step = True
    small, calls = proj.small_rows, []
    proj.small_rows = lambda *args: calls.append(len(args[0])) or small(*args)
    with torch.inference_mode():
        for rows in (1, 4, 5, 8, 64):
            _check(proj, layer, rows, 3e-2)
        assert calls == [1, 4]  # 5 and more rows: the prepacked weight
        proj.decode_step = False  # prompt chunks of any size: the prepacked weight, F.linear bit for bit
        packed_calls = []
        linear = prepacked.prepacked_linear
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(prepacked, "prepacked_linear", lambda *args: packed_calls.append(1) or linear(*args))
            for rows in (1, 3, 8, 300):
                x = torch.randn(rows, 96, dtype=torch.bfloat16)
                assert torch.equal(proj(x, layer), F.linear(x, layer.weight, layer.bias))
        assert calls == [1, 4] and len(packed_calls) == 4


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (200, 576)])
def test_prepacked_weights_give_the_same_numbers_at_every_row_count(shape) -> None:
    """A row's outputs do not depend on how many other rows share the step, from two rows up (a lone row is the
    Projector's business). On AMX CPUs oneDNN's own numbers follow the row count (a 1536-input projection's rows
    differ at 45-69 rows), so there the calls go in tiles of one size: prepacked.tile_rows()."""
    torch.manual_seed(3)
    weight = torch.randn(*shape, dtype=torch.bfloat16) * 0.05
    if not prepacked.supported(weight):
        assert not prepacked.supported(weight.float())  # fp32 weights never take this path
        return
    packed, tile = prepacked.tried(weight), prepacked.tile_rows()
    x = torch.randn(64, shape[1], dtype=torch.bfloat16)
    together = prepacked.prepacked_linear(x, packed, None, tile)
    for rows in (2, 5, 9, 14, 20, 33, 45, 50, 63):
        assert torch.equal(prepacked.prepacked_linear(x[:rows], packed, None, tile), together[:rows]), rows


def test_tiled_prepacked_products_depend_only_on_each_row() -> None:
    """In tiles of one size (the last padded) a row gets the same numbers at any row count, at any place."""
    torch.manual_seed(5)
    weight = torch.randn(576, 1536, dtype=torch.bfloat16) * 0.05
    if not prepacked.supported(weight):
        assert not prepacked.supported(weight.float())  # fp32 weights never take this path
        return
    packed = prepacked.tried(weight)
    x = torch.randn(200, 1536, dtype=torch.bfloat16)
    together = prepacked.prepacked_linear(x, packed, None, 64)
    torch.testing.assert_close(together, F.linear(x, weight), atol=2e-2, rtol=2e-2)
    for start, rows in ((0, 1), (0, 64), (0, 65), (7, 130), (150, 50)):
        part = prepacked.prepacked_linear(x[start: start + rows], packed, None, 64)
        assert torch.equal(part, together[start: start + rows]), (start, rows)


def test_projector_tiles_prepacked_products_on_amx_cpus(monkeypatch) -> None:
    layer = nn.Linear(96, 40, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    if not prepacked.supported(layer.weight):  # no fast bf16: nothing prepacked, nothing tiled
        proj = Projector(compile_single_row=False, native_rows=True)
        proj.warm_up([layer])
        assert not proj.prepacked and proj.tile_rows == 0
        return
    for amx, tile in ((True, prepacked.TILE_ROWS), (False, 0)):
        monkeypatch.setattr(prepacked, "cpu_has_amx", lambda amx=amx: amx)
        proj = Projector(compile_single_row=False, native_rows=True)
        proj.warm_up([layer])
        assert proj.tile_rows == tile


def test_a_one_row_prompt_chunk_gets_the_numbers_it_gets_among_other_rows() -> None:
    """oneDNN multiplies a lone row another way (some rows of a 1536-input bf16 projection differ in the last bit),
    so a prompt whose last layer keeps one row would get other logits beside another request than alone; the
    prompt path computes a lone row as two."""
    torch.manual_seed(4)
    layer = nn.Linear(1536, 576, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        layer.weight.normal_(0.0, 0.05)
    proj = Projector(compile_single_row=False, native_rows=True)
    proj.warm_up([layer])
    x = torch.randn(64, 1536, dtype=torch.bfloat16)
    with torch.inference_mode():
        together = proj(x, layer)
        alone = torch.cat([proj(x[r: r + 1], layer) for r in range(64)])
    assert torch.equal(alone, together)


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576)])
def test_decode_rows_of_a_mixed_step_get_their_decode_only_numbers(shape) -> None:
    """Decode rows beside prompt rows get what a decode-only step of as many rows gives them, and the prompt rows
    what they get alone, whatever route each takes on this CPU (the few-row kernel, tiles on AMX, one call)."""
    torch.manual_seed(6)
    layer = nn.Linear(shape[1], shape[0], bias=False, dtype=torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        layer.weight.normal_(0.0, 0.05)
    proj = Projector(compile_single_row=False, native_rows=True)
    proj.warm_up([layer])
    x = torch.randn(60, shape[1], dtype=torch.bfloat16)
    with torch.inference_mode():
        for num_decodes in (3, 20, 47):
            proj.decode_step, proj.num_decode_rows = False, num_decodes
            mixed = proj(x, layer)
            proj.num_decode_rows = 0
            prompts = proj(x[num_decodes:], layer)
            proj.decode_step = True
            decodes = proj(x[:num_decodes], layer)
            assert torch.equal(mixed[:num_decodes], decodes), num_decodes
            assert torch.equal(mixed[num_decodes:], prompts), num_decodes
