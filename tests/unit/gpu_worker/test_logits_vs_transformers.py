"""Our paged forward against transformers' own implementation, fp32, on tiny random-weight models.

Tolerance 1e-4 absolute on logits: both sides run the same fp32 math in a different order (fused projections,
paged gathers), which leaves differences around 1e-6 here.
"""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from tests.unit.gpu_worker.tiny_models import TINY_CONFIGS, PagedModel, make_tiny_model

ATOL = 1e-4
ARCHS = sorted(TINY_CONFIGS)


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return make_tiny_model(request.param, folder), folder


@pytest.fixture(params=["torch", "torch+native", "triton", "triton+cuda-layers"])
def backend(request) -> str:
    """Every check runs through both attention backends (triton in interpreter mode on CPU), the torch one also
    with the C kernels of kernels/cpu (decode attention, the fp32 packed GEMM, fused norms and SiLU), and the
    triton one also with the CUDA platform's layer kernels (F.linear, fused RMSNorm, rotary, SiLU-mul)."""
    return request.param


def reference_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


def prompt(seed: int, length: int, vocab: int = 101) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_whole_prompt_prefill(tiny, backend):
    hf_model, folder = tiny
    tokens = prompt(1, 37)
    paged = PagedModel(folder, backend=backend)
    logits = paged.step([(paged.new_request("a", tokens), len(tokens))])["a"]
    torch.testing.assert_close(logits, reference_logits(hf_model, tokens), atol=ATOL, rtol=0)


def test_prompt_in_uneven_chunks(tiny, backend):
    hf_model, folder = tiny
    tokens = prompt(2, 45)
    paged = PagedModel(folder, backend=backend)
    state = paged.new_request("a", tokens)
    pieces = [paged.step([(state, n)])["a"] for n in (5, 1, 13, 3, 23)]
    torch.testing.assert_close(torch.cat(pieces), reference_logits(hf_model, tokens), atol=ATOL, rtol=0)


def test_32_decode_steps(tiny, backend):
    hf_model, folder = tiny
    tokens = prompt(3, 12 + 32)  # teacher-forced: the decode inputs are fixed random tokens
    paged = PagedModel(folder, backend=backend)
    if backend == "torch+native":  # the decode steps below go through the C kernels, not a silent fall-back
        assert isinstance(paged.model.lm_head.kernel, CGemmLinear)  # fp32 models
        assert paged.model.norm.kernel == paged.platform.native.fused_ops.rms_norm
    state = paged.new_request("a", tokens)
    rows = [paged.step([(state, 12)])["a"]]
    rows += [paged.step([(state, 1)])["a"] for _ in range(32)]
    torch.testing.assert_close(torch.cat(rows), reference_logits(hf_model, tokens), atol=ATOL, rtol=0)


def test_mixed_step_with_shared_prefix_blocks(tiny, backend):
    """Two prefill chunks and three decodes in one forward; two of the requests share physical prefix blocks."""
    hf_model, folder = tiny
    paged = PagedModel(folder, block_size=4, backend=backend)
    shared_prefix = prompt(4, 8)  # two full blocks
    owner = paged.new_request("owner", shared_prefix + prompt(5, 6))
    decoders = [paged.new_request(f"d{i}", prompt(10 + i, 9 + 3 * i)) for i in range(3)]
    for d in decoders:  # bring each decoder to one token before its end
        paged.step([(d, d.num_prompt_tokens - 1)])
    paged.step([(owner, owner.num_prompt_tokens)])
    sharer_tokens = shared_prefix + prompt(6, 7)
    sharer = paged.new_request("sharer", sharer_tokens, shared_blocks=owner.block_ids[:2])
    fresh = paged.new_request("fresh", prompt(7, 10))
    out = paged.step([(fresh, 6), (decoders[0], 1), (sharer, 5), (decoders[1], 1), (decoders[2], 1)])
    assert sharer.block_ids[:2] == owner.block_ids[:2]
    torch.testing.assert_close(out["fresh"], reference_logits(hf_model, fresh.token_ids)[:6], atol=ATOL, rtol=0)
    torch.testing.assert_close(out["sharer"], reference_logits(hf_model, sharer_tokens)[8:13], atol=ATOL, rtol=0)
    for d in decoders:
        torch.testing.assert_close(out[d.req_id], reference_logits(hf_model, d.token_ids)[-1:], atol=ATOL, rtol=0)
