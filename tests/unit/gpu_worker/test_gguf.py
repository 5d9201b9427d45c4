"""GGUF checkpoints served from their blocks: tiny random Llama / Qwen2 models written with the `gguf` package
(K-quants by ggml_kquant_encoder), their logits through our C kernels against the fp32 transformers model of the
same weights dequantized by gguf.quants (1e-4), and transformers' own GGUF loading against that reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as T
from gguf import quants

from pagedserve.services.gpu_worker.gguf.blocks import UnsupportedTensorTypeError, grid_from_blocks
from pagedserve.services.gpu_worker.layers.grid_embedding import GridEmbedding
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from tests.unit.gpu_worker.tiny_gguf import MIXED, quantize, write_tiny_gguf
from tests.unit.gpu_worker.tiny_models import PagedModel

ATOL = 1e-4
QTYPES = {"Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1, "Q8_0": T.Q8_0, "Q4_K": T.Q4_K,
          "Q5_K": T.Q5_K, "Q6_K": T.Q6_K,
          "F16": T.F16, "Q4_K_M-mix": MIXED}


def _tokens(seed: int, n: int) -> list[int]:
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K],
                         ids=lambda t: t.name)
def test_blocks_are_ggml_dequantization_bit_for_bit(qtype) -> None:
    x = np.random.default_rng(int(qtype)).standard_normal((6, 512)).astype(np.float32)
    blocks = quantize(x, qtype)
    grid = grid_from_blocks(blocks, qtype, 6, 512)
    values = grid.codes.float().view(6, -1, grid.group) * grid.scales.unsqueeze(-1) + grid.offsets.unsqueeze(-1)
    assert torch.equal(values.view(6, 512), torch.from_numpy(quants.dequantize(blocks, qtype)))


@pytest.mark.parametrize("qtype", list(QTYPES), ids=list(QTYPES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_the_dequantized_reference(arch: str, qtype: str, tmp_path) -> None:
    """Prompt then teacher-forced decodes (the one-call C decode) through the coded C GEMMs; no fp32 weights."""
    reference = write_tiny_gguf(arch, tmp_path, QTYPES[qtype])
    paged = PagedModel(tmp_path, backend="torch+native")
    assert all(isinstance(m.kernel, CGemmLinear) and m.grid is None for m in paged.model.linears())
    if qtype != "F16":
        assert isinstance(paged.model.embed_tokens, GridEmbedding)
        assert all(m.kernel.weight.bits != 32 for m in paged.model.linears())
        assert all(m.weight.device.type == "meta" for m in paged.model.linears())  # the codes, not fp32 copies
    tokens = _tokens(1, 17 + 6)
    state = paged.new_request("a", tokens)
    rows = [paged.step([(state, 17)])["a"]] + [paged.step([(state, 1)])["a"] for _ in range(6)]
    torch.testing.assert_close(torch.cat(rows), _reference(reference, tokens), atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_transformers_reads_the_same_file_alike(arch: str, tmp_path) -> None:
    reference = write_tiny_gguf(arch, tmp_path, MIXED)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                           dtype=torch.float32)
    tokens = _tokens(2, 19)
    paged = PagedModel(tmp_path, backend="torch+native")
    ours = paged.step([(paged.new_request("a", tokens), len(tokens))])["a"]
    torch.testing.assert_close(_reference(hf, tokens), _reference(reference, tokens), atol=ATOL, rtol=0)
    torch.testing.assert_close(ours, _reference(hf, tokens), atol=ATOL, rtol=0)


def test_without_the_c_kernels_the_blocks_are_dequantized(tmp_path) -> None:
    reference = write_tiny_gguf("llama", tmp_path, MIXED)
    paged = PagedModel(tmp_path, backend="torch")
    assert paged.model.layers[0].mlp.down_proj.weight.dtype == torch.float32
    tokens = _tokens(3, 15)
    logits = paged.step([(paged.new_request("a", tokens), len(tokens))])["a"]
    torch.testing.assert_close(logits, _reference(reference, tokens), atol=ATOL, rtol=0)


def test_unsupported_types_are_refused_by_name(tmp_path) -> None:
    write_tiny_gguf("llama", tmp_path, {"ffn_up": T.TQ2_0, "": T.Q4_K})
    with pytest.raises(UnsupportedTensorTypeError, match=r"'blk\.0\.ffn_up\.weight' is TQ2_0.*supported: Q4_0"):
        PagedModel(tmp_path, backend="torch+native")
