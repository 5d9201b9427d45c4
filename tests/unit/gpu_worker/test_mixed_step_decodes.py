"""A decode's numbers do not depend on whether prompt chunks share its step: the decode rows of a mixed step go
through the few-row kernel a decode-only step of as many rows uses, so a seeded request gives the same text
whether or not another request's prompt happened to be computed beside it (the default model, bf16, C kernels)."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.input_batch import build_model_input
from tests.unit.gpu_worker.tiny_models import PagedModel

PROMPT = list(range(1000, 1037))


def _decode_logits(paged: PagedModel, req_id: str, beside: list[int] | None, keep: bool) -> torch.Tensor:
    """Compute PROMPT, then one decode step of it, alone or beside the prompt `beside`: the decode's logits."""
    state = paged.new_request(req_id, PROMPT)
    paged.step([(state, len(PROMPT))])
    state.token_ids.append(2000)
    scheduled = [(state, 1)]
    if beside is not None:
        scheduled.append((paged.new_request(req_id + "-other", beside), len(beside)))
    for s, n in scheduled:
        paged._ensure_blocks(s, s.num_computed_tokens + n)
    batch = build_model_input([s for s, _ in scheduled], [n for _, n in scheduled], paged.block_size, paged.device)
    assert batch.requests[0] is state  # decodes first
    with torch.inference_mode():
        kept = batch.logits_rows if keep else None
        hidden = paged.forward(batch.token_ids, batch.positions, paged.kv.layers, batch.meta, kept)
        return paged.model.compute_logits(hidden, batch.meta.rows if kept is None else kept.rows)[0]


@pytest.fixture(scope="module")
def paged(smollm2_dir):
    model = PagedModel(smollm2_dir, block_size=16, num_blocks=64, backend="torch+native", dtype="bfloat16")
    assert model.platform.native.small_linear is not None, "the C few-row kernel did not build"
    return model


@pytest.mark.parametrize("keep", [False, True])
def test_a_decode_beside_a_prompt_chunk_gets_its_decode_only_numbers(paged, keep: bool) -> None:
    alone = _decode_logits(paged, f"alone-{keep}", None, keep)
    for other in (list(range(3000, 3009)), list(range(4000, 4050))):
        assert torch.equal(_decode_logits(paged, f"beside-{keep}-{len(other)}", other, keep), alone)
