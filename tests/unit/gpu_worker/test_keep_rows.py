"""DecoderLM.forward(keep=...): the last layer's output projection and MLP run only on the rows asked for
(those that sample), with the same numbers for them and the same keys and values in the cache for every row."""

from __future__ import annotations

import pytest
import torch

from pagedserve.services.gpu_worker.input_batch import build_model_input
from tests.unit.gpu_worker.tiny_models import PagedModel, make_tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_tiny_model("llama", path)
    return path


def _step(folder, backend: str, keep: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Two prompts, then a step of one decode, one middle chunk and one last chunk: (hidden, logits rows, caches)."""
    paged = PagedModel(folder, backend=backend)
    a = paged.new_request("a", list(range(3, 20)))
    b = paged.new_request("b", list(range(40, 70)))
    c = paged.new_request("c", list(range(70, 95)))
    paged.step([(a, 17), (b, 10)])
    a.token_ids.append(5)
    scheduled = [(a, 1), (b, 12), (c, 25)]  # a decodes, b stops mid-prompt, c finishes its prompt
    for state, n in scheduled:
        paged._ensure_blocks(state, state.num_computed_tokens + n)
    batch = build_model_input([s for s, _ in scheduled], [n for _, n in scheduled], paged.block_size, paged.device)
    with torch.inference_mode():
        hidden = paged.forward(batch.token_ids, batch.positions, paged.kv.layers, batch.meta,
                               batch.logits_rows if keep else None)
    caches = [cache[:paged.next_block].clone() for layer in paged.kv.layers for cache in layer]
    return hidden, batch.logits_rows.indices, caches


@pytest.mark.parametrize("backend", ["torch", "torch+native"])
def test_only_the_sampling_rows_come_out_with_the_same_numbers(folder, backend):
    every_row, rows, caches = _step(folder, backend, keep=False)
    kept, rows_again, kept_caches = _step(folder, backend, keep=True)
    assert torch.equal(rows, rows_again) and rows.tolist() == [0, 37]  # a's decode and c's last prompt token
    assert kept.shape == (2, every_row.shape[1])
    if backend == "torch+native":  # the C GEMMs give each row the same sum whatever the row count
        assert torch.equal(kept, every_row[rows])
    else:
        torch.testing.assert_close(kept, every_row[rows], atol=1e-5, rtol=0)
    assert all(torch.equal(x, y) for x, y in zip(caches, kept_caches, strict=True))


def test_a_step_with_no_sampling_row_still_fills_the_cache(folder):
    paged = PagedModel(folder, backend="torch+native")
    state = paged.new_request("a", list(range(3, 40)))
    paged._ensure_blocks(state, 20)
    batch = build_model_input([state], [20], paged.block_size, paged.device)
    assert batch.logits_rows.indices.numel() == 0 and batch.logits_rows.rows.num_rows == 0
    with torch.inference_mode():
        hidden = paged.forward(batch.token_ids, batch.positions, paged.kv.layers, batch.meta, batch.logits_rows)
    assert hidden.shape == (0, paged.config.hidden_size)
    reference = PagedModel(folder, backend="torch+native")
    reference.step([(reference.new_request("a", list(range(3, 40))), 20)])
    for (k, v), (k_ref, v_ref) in zip(paged.kv.layers, reference.kv.layers, strict=True):
        assert torch.equal(k[:5], k_ref[:5]) and torch.equal(v[:5], v_ref[:5])
