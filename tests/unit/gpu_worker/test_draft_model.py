"""The worker's draft-model proposer on tiny random models, steps written by hand: drafts are the draft model's
greedy tokens, its KV follows the verified tokens, a draft of another vocabulary is refused at start, and draft
positions that do not fit a mirror (or come to a worker without a draft model) fail their request alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from pagedserve.services.gpu_worker.model_config import UnsupportedModelError
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import CachedRequest, NewRequest, StepInput, StepOutput
from tests.unit.gpu_worker.tiny_models import make_tiny_model

GREEDY = SamplingParams(max_tokens=32, temperature=0.0)
BLOCK_SIZE = 4
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("target")
    make_tiny_model("llama", folder)
    return folder


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory) -> Path:
    """Same architecture and vocabulary, other weights: its drafts are mostly rejected."""
    folder = tmp_path_factory.mktemp("draft")
    make_tiny_model("llama", folder, seed=1)
    return folder


def make_worker(model_dir: Path, draft_dir: Path | None = None) -> Worker:
    speculative = "" if draft_dir is None else json.dumps({"method": "draft_model", "model": str(draft_dir),
                                                           "num_speculative_tokens": 3})
    return Worker(WorkerConfig(model_dir=str(model_dir), dtype="float32", block_size=BLOCK_SIZE,
                               kv_cache_memory_bytes=2 * 1024**2, torch_compile=False, native_kernels=False,
                               int8_activations=False, speculative_config=speculative))


def _prefill(worker: Worker, req_id: str) -> int:
    out = worker.execute_step(StepInput(new_requests=[NewRequest(req_id, PROMPT, len(PROMPT), GREEDY,
                                                                 [0, 1, 2, 3], 0)],
                                        num_scheduled_tokens={req_id: len(PROMPT)},
                                        incarnation_id=worker.incarnation_id))
    return out.sampled_token_ids[0]


def _drafted_step(worker: Worker, req_id: str, computed: int, k: int, num_scheduled: int | None = None
                  ) -> StepOutput:
    """A step giving the request k draft positions (the blocks a rejected tail gave back return, as from the
    scheduler)."""
    regained = list(range(len(worker.requests[req_id].block_ids), 4)) if req_id in worker.requests else []
    return worker.execute_step(StepInput(cached_requests=[CachedRequest(req_id, regained, computed)],
                                         num_scheduled_tokens={req_id: num_scheduled or 1 + k},
                                         draft_model_slots={req_id: k}, incarnation_id=worker.incarnation_id))


def _greedy_tokens(worker: Worker, n: int) -> list[int]:
    """The target's plain greedy continuation of PROMPT, one token a step."""
    tokens = [_prefill(worker, "plain")]
    for i in range(n - 1):
        out = worker.execute_step(StepInput(cached_requests=[CachedRequest("plain", [], len(PROMPT) + i)],
                                            num_scheduled_tokens={"plain": 1}, incarnation_id=worker.incarnation_id))
        tokens.append(out.sampled_token_ids[0])
    worker.execute_step(StepInput(finished_req_ids=["plain"], incarnation_id=worker.incarnation_id))
    return tokens


def test_the_target_as_its_own_draft_proposes_its_greedy_tokens_and_its_kv_follows(target):
    worker = make_worker(target, target)
    want = _greedy_tokens(worker, 9)
    assert _prefill(worker, "a") == want[0]
    state = worker.requests["a"]
    assert state.draft_num_computed == 0  # the first draft computes the prompt into the draft cache
    out = _drafted_step(worker, "a", len(PROMPT), 3)
    assert out.num_accepted_drafts == {"a": 3} and out.sampled_token_ids == want[1:5]
    # fed: prompt, first token, two drafts (the third is never fed); all accepted: all valid
    assert state.draft_num_computed == len(PROMPT) + 3 and state.num_computed_tokens == len(PROMPT) + 4
    out = _drafted_step(worker, "a", len(PROMPT) + 4, 3)  # catches up the third draft and the bonus token
    assert out.num_accepted_drafts == {"a": 3} and out.sampled_token_ids == want[5:9]
    assert state.draft_num_computed == len(PROMPT) + 7


def test_rejected_drafts_roll_the_draft_kv_back_and_the_tokens_stay_the_targets(target, other_draft):
    plain = _greedy_tokens(make_worker(target), 9)
    worker = make_worker(target, other_draft)
    _prefill(worker, "a")
    state = worker.requests["a"]
    tokens, computed = [], len(PROMPT)
    while len(tokens) < 8:
        before = len(state.token_ids)
        out = _drafted_step(worker, "a", computed, 3)
        accepted = out.num_accepted_drafts["a"]
        tokens += out.sampled_token_ids
        computed += 1 + accepted
        # valid draft KV: the known tokens before the step and the accepted drafts fed after them
        assert state.draft_num_computed == before + min(accepted, 2) == min(before + 2, computed)
        assert state.num_computed_tokens == computed
    assert tokens[:8] == plain[1:9]


def test_a_draft_of_another_vocabulary_is_refused_at_start(target, tmp_path):
    config = transformers.LlamaConfig(vocab_size=202, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="vocabulary has 202 tokens, the target's 101"):
        make_worker(target, tmp_path)


def test_a_draft_whose_tokenizer_maps_other_ids_is_refused_at_start(target, other_draft, tmp_path_factory):
    both = tmp_path_factory.mktemp("with_tokenizers")
    for name, folder in (("target", target), ("draft", other_draft)):
        copy = both / name
        copy.mkdir()
        for file in folder.iterdir():
            (copy / file.name).symlink_to(file)
        vocab = {f"t{i}": i for i in range(101)} if name == "target" else {f"t{100 - i}": i for i in range(101)}
        (copy / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}, "added_tokens": []}))
    with pytest.raises(UnsupportedModelError, match="tokenizer.json maps tokens to other ids"):
        make_worker(both / "target", both / "draft")


def test_draft_positions_that_cannot_be_drafted_fail_their_request_alone(target):
    plain = make_worker(target)
    _prefill(plain, "a")
    out = _drafted_step(plain, "a", len(PROMPT), 3)
    assert [f.req_id for f in out.failed] == ["a"] and "runs no draft model" in out.failed[0].message
    assert "a" not in plain.requests
    worker = make_worker(target, target)
    _prefill(worker, "b")
    out = _drafted_step(worker, "b", len(PROMPT), 3, num_scheduled=3)  # 1 + 3 positions would be 4
    assert [f.req_id for f in out.failed] == ["b"] and "draft positions refused" in out.failed[0].message
    assert worker.requests == {}
