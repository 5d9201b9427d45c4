"""GPTQ / AWQ int4 and FP8 safetensors checkpoints (tiny_quantized.py writes them): their logits through our C
kernels (fp32 runtime) against the fp32 transformers model of the same weights dequantized (1e-4), the layouts
unpacked bit for bit, schemes refused by name, and transformers' own compressed-tensors loading alike."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.services.gpu_worker.loader import read_checkpoint
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.quantized.checkpoint import quantized_state
from pagedserve.services.gpu_worker.quantized.scheme import UnsupportedQuantizationError, read_scheme
from tests.unit.gpu_worker.tiny_models import PagedModel
from tests.unit.gpu_worker.tiny_quantized import write_awq, write_fp8, write_gptq

ATOL = 1e-4
WRITERS = {"gptq-g128": lambda a, d: write_gptq(a, d), "gptq-g64": lambda a, d: write_gptq(a, d, group=64),
           "gptq-act-order": lambda a, d: write_gptq(a, d, act_order=True),
           "awq-g128": lambda a, d: write_awq(a, d), "awq-g32": lambda a, d: write_awq(a, d, group=32),
           "fp8-channel": lambda a, d: write_fp8(a, d), "fp8-tensor": lambda a, d: write_fp8(a, d, "tensor")}
GRIDS = ("gptq-g128", "gptq-g64", "awq-g128", "awq-g32")


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def _paged_logits(paged: PagedModel, tokens: list[int], prompt: int) -> torch.Tensor:
    state = paged.new_request("a", tokens)
    rows = [paged.step([(state, prompt)])["a"]]
    rows += [paged.step([(state, 1)])["a"] for _ in range(len(tokens) - prompt)]
    return torch.cat(rows)


@pytest.mark.parametrize("fmt", list(WRITERS))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_the_dequantized_reference(arch: str, fmt: str, tmp_path) -> None:
    """Prompt then teacher-forced decodes through the C GEMMs: int4 codes stay codes (no fp32 weights)."""
    reference, _ = WRITERS[fmt](arch, tmp_path)
    paged = PagedModel(tmp_path, backend="torch+native")
    assert all(isinstance(m.kernel, CGemmLinear) for m in paged.model.linears())
    if fmt in GRIDS:
        coded = [m for m in paged.model.linears() if m is not paged.model.lm_head]
        assert all(m.kernel.weight.bits == 4 and m.weight.device.type == "meta" for m in coded)
    tokens = _tokens(1, 17 + 6)
    torch.testing.assert_close(_paged_logits(paged, tokens, 17), _logits(reference, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("fmt", ["gptq-g128", "awq-g128", "fp8-channel"])
def test_unpacked_weights_are_the_published_dequantization_bit_for_bit(fmt: str, tmp_path) -> None:
    reference, _ = WRITERS[fmt]("qwen2", tmp_path)
    state = quantized_state(read_checkpoint(tmp_path), read_scheme(tmp_path))
    for name, expected in reference.state_dict().items():
        if name.endswith("proj.weight"):
            weight = state[name]
            if isinstance(weight, WeightGrid):
                assert weight.bits == 4 and weight.group == 32
                groups = weight.codes.float().view(weight.codes.shape[0], -1, 32)
                weight = (groups * weight.scales.unsqueeze(-1) + weight.offsets.unsqueeze(-1)).flatten(1)
            assert torch.equal(weight, expected), name


def test_without_the_c_kernels_int4_is_dequantized(tmp_path) -> None:
    reference, _ = write_gptq("llama", tmp_path)
    paged = PagedModel(tmp_path, backend="torch")
    assert paged.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    tokens = _tokens(3, 15)
    torch.testing.assert_close(_paged_logits(paged, tokens, 15), _logits(reference, tokens), atol=ATOL, rtol=0)


def test_int4_checkpoints_are_served_in_fp32_where_the_c_gemms_run(tmp_path) -> None:
    write_awq("llama", tmp_path)
    platform = CpuPlatform(native_kernels=True, torch_compile=False)
    assert platform.serving_dtype(torch.float16, str(tmp_path)) == torch.float32


def test_transformers_reads_the_compressed_tensors_checkpoint_alike(tmp_path) -> None:
    """Weights only: transformers also fake-quantizes the activations of a W8A8 checkpoint, which we do not."""
    reference, _ = write_fp8("qwen2", tmp_path, activations=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    tokens = _tokens(2, 19)
    paged = PagedModel(tmp_path, backend="torch+native")
    torch.testing.assert_close(_logits(hf, tokens), _logits(reference, tokens), atol=ATOL, rtol=0)
    torch.testing.assert_close(_paged_logits(paged, tokens, 19), _logits(hf, tokens), atol=ATOL, rtol=0)


def test_unsupported_schemes_and_mismatched_flags_are_refused_by_name(tmp_path) -> None:
    write_gptq("llama", tmp_path)
    with pytest.raises(UnsupportedQuantizationError, match="--quantization awq does not match.*gptq"):
        read_scheme(tmp_path, "awq")
    assert read_scheme(tmp_path, "gptq").method == "gptq"
    config = json.loads((tmp_path / "config.json").read_text())
    for bad, message in [({"quant_method": "gptq", "bits": 8}, "8-bit"), ({"quant_method": "bitsandbytes"},
                                                                           "'bitsandbytes' is not served"),
                         ({"quant_method": "awq", "version": "gemv"}, "'gemv'"),
                         ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
                             "g": {"weights": {"type": "int", "num_bits": 4}}}}, "'pack-quantized'")]:
        (tmp_path / "config.json").write_text(json.dumps(config | {"quantization_config": bad}))
        with pytest.raises(UnsupportedQuantizationError, match=message):
            read_scheme(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "quantization_config"}))
    with pytest.raises(UnsupportedQuantizationError, match="does not quantize at load"):
        read_scheme(tmp_path, "fp8")
