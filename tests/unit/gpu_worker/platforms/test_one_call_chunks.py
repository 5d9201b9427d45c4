"""Steps of decodes and short chunks (speculative verifications: a request's last token and its 1..16 drafts) in one
C call (platforms/cpu/one_call_decode.py) give the layer-by-layer path's numbers, bit for bit: the kept rows' hidden
states and logits, and the KV cache; longer chunks, and chunks where the C prefill kernel does not run, stay on the
layer-by-layer path."""

from __future__ import annotations

import random

import pytest
import torch

from pagedserve.kernels.cpu.decode_layers import DecodeLayers
from pagedserve.services.gpu_worker.input_batch import build_model_input
from pagedserve.services.gpu_worker.platforms.cpu.one_call_decode import MAX_CHUNK_ROWS
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.gpu_worker.platforms.test_one_call_decode import BLOCK, CHUNK_BLOCK, Paged, _save

PROMPTS = [3, 17, 9, 30]  # across the blocks of 16 and the sliding window of 12
VOCAB = 101


def _states(lengths: list[int]) -> list[RequestState]:
    """Requests over blocks in falling order (their tables are not runs of consecutive blocks)."""
    states = []
    for i, length in enumerate(lengths):
        ids = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(i)).tolist()
        blocks = list(reversed(range(16 * i, 16 * i + 16)))
        states.append(RequestState(f"r{i}", ids, length, SamplingParams(temperature=0.0), blocks, 0, ()))
    return states


def _schedule(steps: int, seed: int) -> list[list[tuple[int, int]]]:
    """Per step and request: (drafts, how many of them are accepted); 0 drafts: a decode."""
    rng = random.Random(seed)
    plan = []
    for _ in range(steps):
        drafts = [rng.choice([0, 1, 4, 7, MAX_CHUNK_ROWS - 1]) for _ in PROMPTS]
        plan.append([(k, rng.randint(0, k)) for k in drafts])
    return plan


@torch.inference_mode()
def _verify_steps(paged: Paged, plan: list[list[tuple[int, int]]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prompts whole, then the planned steps: each request computes its newest token and its drafts; the
    accepted ones and a next token join its tokens, the rejected ones' cache slots are written over later. The
    (hidden states, logits) of each step's kept rows."""
    states = _states(PROMPTS)
    _forward(paged, states, PROMPTS)
    rng = random.Random(1)
    outputs = []
    for step in plan:
        for state, (k, _) in zip(states, step, strict=True):
            state.token_ids.append(rng.randrange(VOCAB))  # the token sampled last step
            state.draft_token_ids = [rng.randrange(VOCAB) for _ in range(k)]
        outputs.append(_forward(paged, states, [1 + k for k, _ in step]))
        for state, (k, accepted) in zip(states, step, strict=True):
            state.token_ids.extend(state.draft_token_ids[:accepted])
            state.num_computed_tokens += accepted - k  # the rejected drafts' keys are not kept
            state.draft_token_ids = []
    return outputs


def _forward(paged: Paged, states: list[RequestState], counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    batch = build_model_input(states, counts, paged.block, torch.device("cpu"))
    keep = batch.logits_rows
    hidden = paged.forward(batch.token_ids, batch.positions, paged.kv.layers, batch.meta, keep)
    for state, n in zip(states, counts, strict=True):
        state.num_computed_tokens += n
    return hidden, paged.model.compute_logits(hidden, keep.rows)


@pytest.mark.parametrize(("name", "int8", "cache_dtype", "batch_invariant"), [
    ("llama", False, torch.float32, False), ("llama", True, torch.float16, False),
    ("qwen2", False, torch.float16, False), ("mistral", True, torch.float32, False),
    ("mistral", False, torch.float16, False), ("llama", True, torch.float16, True),
    ("mistral", False, torch.float32, True)])
def test_verification_steps_in_one_call_give_the_layer_path_numbers(tmp_path, monkeypatch, name: str, int8: bool,
                                                                   cache_dtype: torch.dtype,
                                                                   batch_invariant: bool) -> None:
    _save(name, tmp_path, grid=int8)
    fused, layered = (Paged(tmp_path, int8, cache_dtype, fused=f, batch_invariant=batch_invariant, block=CHUNK_BLOCK)
                      for f in (True, False))
    assert fused.one_call is not None and fused.one_call.layers.kernels.prefill is not None
    assert (fused.one_call.layers.kernels.decode is None) == batch_invariant
    calls = _count_calls(monkeypatch)
    plan = _schedule(6, seed=0)
    ours = _verify_steps(fused, plan)
    assert len(calls) == len(plan), "every verification step should take the one-call path"
    for (hidden, logits), (their_hidden, their_logits) in zip(ours, _verify_steps(layered, plan), strict=True):
        assert torch.equal(hidden, their_hidden) and torch.equal(logits, their_logits)
    for (k1, v1), (k2, v2) in zip(fused.kv.layers, layered.kv.layers, strict=True):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_a_step_with_a_chunk_past_the_limit_runs_layer_by_layer(tmp_path, monkeypatch) -> None:
    _save("llama", tmp_path, grid=False)
    paged = Paged(tmp_path, False, torch.float32, fused=True, block=CHUNK_BLOCK)
    calls = _count_calls(monkeypatch)
    states = _states([5, MAX_CHUNK_ROWS + 1])
    _forward(paged, states, [5, MAX_CHUNK_ROWS + 1])
    assert not calls
    states = _states([5, MAX_CHUNK_ROWS])
    _forward(paged, states, [5, MAX_CHUNK_ROWS])  # short prompts: chunks as short as verifications
    assert len(calls) == 1


def test_without_the_c_prefill_kernel_chunks_run_layer_by_layer(tmp_path, monkeypatch) -> None:
    """Blocks of 4: chunks go to torch's attention there, which the C call does not run."""
    _save("llama", tmp_path, grid=False)
    paged = Paged(tmp_path, False, torch.float32, fused=True, block=BLOCK)
    assert paged.one_call is not None and paged.one_call.layers.kernels.prefill is None
    calls = _count_calls(monkeypatch)
    states = _states([5, 6])
    _forward(paged, states, [5, 6])
    states[1].token_ids.append(7)
    states[1].draft_token_ids = [8, 9]
    states[0].token_ids.append(7)
    _forward(paged, states, [1, 3])
    assert not calls


def test_the_decode_layers_refuse_chunk_starts_that_miss_the_row_count(tmp_path) -> None:
    _save("llama", tmp_path, grid=False)
    layers = Paged(tmp_path, False, torch.float32, fused=True, block=CHUNK_BLOCK).one_call.layers
    rows = 3
    cos = sin = torch.zeros(rows, layers.shape.head_dim // 2)
    with pytest.raises(ValueError, match="chunk_starts"):
        layers(torch.zeros(rows, layers.shape.hidden), cos, sin, torch.full((rows,), -1), torch.zeros(2, 1),
               torch.ones(2, dtype=torch.int32), 1, torch.tensor([0, 1], dtype=torch.int32))


def _count_calls(monkeypatch) -> list[int]:
    """The list that gets an entry for each call of the C decode layers from now on."""
    calls: list[int] = []
    original = DecodeLayers.__call__

    def counted(self: DecodeLayers, *args) -> torch.Tensor:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(DecodeLayers, "__call__", counted)
    return calls
