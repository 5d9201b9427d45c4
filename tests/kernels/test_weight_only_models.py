"""GPTQ / AWQ int4 and FP8 checkpoints (tests/unit/gpu_worker/tiny_quantized.py) through the CUDA platform's
bindings (on a CPU-only machine the Triton kernels run in the interpreter on CPU tensors): the projections stay
packed (WeightOnlyLinear, no dense weight) and the logits of a prompt and teacher-forced decodes match the fp32
transformers model of the dequantized weights to 1e-4, through the Triton GEMM and through the dequantize-then-
F.linear fallback alike."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.weight_only_formats import FP8Weight, Int4Weight
from pagedserve.services.gpu_worker.layers.linear import PlainLinear
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from pagedserve.services.gpu_worker.platforms.cuda_linear import TRITON_MAX_ROWS, WeightOnlyLinear
from tests.unit.gpu_worker.tiny_gguf import MIXED, write_tiny_gguf
from tests.unit.gpu_worker.tiny_models import PagedModel
from tests.unit.gpu_worker.tiny_quantized import write_awq, write_fp8, write_gptq

ATOL = 1e-4
PROMPT, DECODES = 17, 3
WRITERS = {"gptq-g128": (lambda d: write_gptq("llama", d), Int4Weight),
           "awq-g32": (lambda d: write_awq("qwen2", d, group=32), Int4Weight),
           "fp8-channel": (lambda d: write_fp8("qwen2", d), FP8Weight),
           "fp8-tensor": (lambda d: write_fp8("llama", d, "tensor"), FP8Weight)}


def _logits(paged: PagedModel, tokens: list[int]) -> torch.Tensor:
    state = paged.new_request("a", tokens)
    rows = [paged.step([(state, PROMPT)])["a"]]
    rows += [paged.step([(state, 1)])["a"] for _ in range(len(tokens) - PROMPT)]
    return torch.cat(rows)


@pytest.mark.parametrize("fallback", [False, True], ids=["triton", "dequantized-fallback"])
@pytest.mark.parametrize("fmt", list(WRITERS))
def test_cuda_bindings_run_quantized_checkpoints(device, fmt, fallback, tmp_path) -> None:
    write, packed_type = WRITERS[fmt]
    reference, _ = write(tmp_path)
    paged = PagedModel(tmp_path, platform=CudaPlatform(device), backend="triton")
    projections = [m for m in paged.model.linears() if m is not paged.model.lm_head]
    assert all(isinstance(m.kernel, WeightOnlyLinear) and isinstance(m.kernel.weight, packed_type)
               and m.weight.device.type == "meta" and m.grid is None and m.fp8 is None for m in projections)
    assert PROMPT <= TRITON_MAX_ROWS  # the prompt too runs the Triton GEMM unless forced to the fallback
    for m in projections:
        m.kernel.max_kernel_rows = 0 if fallback else TRITON_MAX_ROWS
    _assert_matches(paged, reference)


def test_cuda_bindings_dequantize_an_act_order_gptq_checkpoint(device, tmp_path) -> None:
    """Act-order (g_idx not i // group) has no contiguous groups: dense weights at load, plain F.linear."""
    reference, _ = write_gptq("qwen2", tmp_path, act_order=True)
    paged = PagedModel(tmp_path, platform=CudaPlatform(device), backend="triton")
    assert all(isinstance(m.kernel, PlainLinear) for m in paged.model.linears())
    _assert_matches(paged, reference)


def test_cuda_bindings_run_a_gguf_mix_4bit_grids_packed_the_rest_dequantized(device, tmp_path) -> None:
    """A Q4_K_M-like GGUF: Q4_K projections (4-bit, groups of 32) run packed; q|k|v with a Q6_K v, the Q6_K
    down projection and the Q8_0 embedding are dequantized at load."""
    reference = write_tiny_gguf("llama", tmp_path, MIXED)
    paged = PagedModel(tmp_path, platform=CudaPlatform(device), backend="triton")
    layer = paged.model.layers[0]
    assert isinstance(layer.self_attn.o_proj.kernel, WeightOnlyLinear)
    assert isinstance(layer.mlp.gate_up_proj.kernel, WeightOnlyLinear)
    assert isinstance(layer.self_attn.qkv_proj.kernel, PlainLinear)
    assert isinstance(layer.mlp.down_proj.kernel, PlainLinear)
    assert isinstance(paged.model.embed_tokens, torch.nn.Embedding)
    _assert_matches(paged, reference)


def _assert_matches(paged: PagedModel, reference: torch.nn.Module) -> None:
    tokens = torch.randint(0, 300, (PROMPT + DECODES,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0].float()
    torch.testing.assert_close(_logits(paged, tokens), expected, atol=ATOL, rtol=0)


def test_cuda_platform_keeps_only_4bit_32_grids_and_not_the_embedding() -> None:
    from pagedserve.kernels.cpu.weight_grid import WeightGrid

    platform = CudaPlatform(torch.device("cpu"))
    codes, scales = torch.zeros(2, 32, dtype=torch.uint8), torch.ones(2, 1)
    assert platform.takes_linear_grid(WeightGrid(codes, scales, scales, 4), torch.float16)
    assert not platform.takes_linear_grid(WeightGrid(codes.to(torch.int8), scales, scales, 8), torch.float16)
    assert not platform.takes_weight_grids(torch.float16)  # the embedding's grid is dequantized
    assert platform.keeps_fp8_weights(torch.bfloat16)
