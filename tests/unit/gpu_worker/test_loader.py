"""Loading checkpoints: dtypes, tied embeddings, the error for unsupported architectures."""

from __future__ import annotations

import json

import pytest
import torch

from pagedserve.services.gpu_worker.model_config import UnsupportedModelError, load_model_config
from tests.unit.gpu_worker.test_logits_vs_transformers import prompt, reference_logits
from tests.unit.gpu_worker.tiny_models import PagedModel, make_tiny_model


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    return make_tiny_model("llama", folder), folder


@pytest.mark.parametrize("dtype,atol", [("bfloat16", 0.02), ("float16", 0.003)])
def test_half_precision_logits_stay_close_to_fp32(tiny_llama, dtype, atol):
    """bf16 keeps 8 mantissa bits (relative step 2^-8 = 0.4%), fp16 11 (0.05%). Logits here are of magnitude ~1.3
    and pass through two layers of rounded matmuls and norms: a few roundings of ~0.005 (bf16) or ~0.0006 (fp16)
    each, bounded by 0.02 and 0.003 (measured: 0.0035 and 0.0006)."""
    hf_model, folder = tiny_llama
    tokens = prompt(8, 30)
    paged = PagedModel(folder, dtype=dtype)
    assert paged.model.embed_tokens.weight.dtype == getattr(torch, dtype)
    assert paged.kv.key_caches[0].dtype == getattr(torch, dtype)
    logits = paged.step([(paged.new_request("a", tokens), len(tokens))])["a"]
    reference = reference_logits(hf_model, tokens)
    assert (logits - reference).abs().max().item() < atol
    assert (logits - reference).abs().max().item() > 0  # really ran in reduced precision


def test_tied_embeddings_share_one_tensor_with_the_head(tiny_llama):
    _, folder = tiny_llama
    paged = PagedModel(folder)
    model = paged.model
    assert paged.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(UnsupportedModelError) as error:
        load_model_config(tmp_path)
    message = str(error.value)
    assert "GPT2LMHeadModel" in message
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"):
        assert name in message


def test_unknown_rope_type_is_rejected(tmp_path, tiny_llama):
    _, folder = tiny_llama
    raw = json.loads((folder / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedModelError, match="yarn"):
        load_model_config(tmp_path)


def test_native_kernels_fall_back_to_torch_when_they_cannot_be_built(tiny_llama, monkeypatch, caplog):
    """No C compiler: the model still loads and matches transformers, through torch, with a warning."""
    import logging

    import pagedserve.services.gpu_worker.platforms.cpu.native as native
    from pagedserve.kernels.cpu.build import KernelBuildError
    from pagedserve.services.gpu_worker.layers.norm import rms_norm
    from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear

    def no_compiler():
        raise KernelBuildError("no C compiler found")

    monkeypatch.setattr(native, "FusedOps", no_compiler)
    hf_model, folder = tiny_llama
    with caplog.at_level(logging.WARNING):
        paged = PagedModel(folder, backend="torch+native")
    assert "C fused-ops kernel is unavailable" in caplog.text
    assert paged.model.norm.kernel is rms_norm  # the fused ops fell back, the C GEMMs did not
    assert all(isinstance(layer.kernel, CGemmLinear) for layer in paged.model.linears())
    tokens = prompt(9, 20)
    logits = paged.step([(paged.new_request("a", tokens), len(tokens))])["a"]
    torch.testing.assert_close(logits, reference_logits(hf_model, tokens), atol=1e-4, rtol=0)
