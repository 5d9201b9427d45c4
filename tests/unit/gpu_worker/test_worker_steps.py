"""The Worker's step contract under faults: incarnation ids, and a bad request failing alone, never its step-mates."""

from __future__ import annotations

import pytest

from pagedserve.services.gpu_worker import model_runner
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import CachedRequest, FailedRequest, NewRequest, StepInput
from tests.unit.gpu_worker.tiny_models import make_tiny_model

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_tiny_model("llama", path)
    return path


def make_worker(folder) -> Worker:
    return Worker(WorkerConfig(model_dir=str(folder), dtype="float32", block_size=BLOCK_SIZE,
                               kv_cache_memory_bytes=2 * 1024**2, torch_compile=False, native_kernels=False,
                               int8_activations=False))


@pytest.fixture(scope="module")
def worker(folder) -> Worker:
    return make_worker(folder)


def new(req_id: str, block: int, sampling: SamplingParams = GREEDY, prompt: tuple[int, ...] = (5, 6, 7, 8, 9),
        ) -> NewRequest:
    return NewRequest(req_id, list(prompt), len(prompt), sampling, [block, block + 1], 0)


def step(worker: Worker, *requests: NewRequest, cached=(), finished=()) -> StepInput:
    return StepInput(new_requests=list(requests), cached_requests=list(cached),
                     num_scheduled_tokens={r.req_id: len(r.token_ids) for r in requests} | {
                         c.req_id: 1 for c in cached},
                     finished_req_ids=list(finished), incarnation_id=worker.incarnation_id)


def test_every_worker_is_a_new_incarnation_and_says_so(worker, folder):
    other = make_worker(folder)
    assert worker.incarnation_id and other.incarnation_id != worker.incarnation_id
    assert worker.describe().incarnation_id == worker.incarnation_id


def test_a_step_for_another_incarnation_touches_nothing(worker):
    stale = StepInput(new_requests=[new("stale", 0)], num_scheduled_tokens={"stale": 5}, incarnation_id="gone")
    output = worker.execute_step(stale)
    assert output.incarnation_id == worker.incarnation_id and output.req_ids == [] and output.failed == []
    assert "stale" not in worker.requests


def test_out_of_vocabulary_logit_bias_fails_alone(worker):
    alone = worker.execute_step(step(worker, new("ref", 10)))
    bad = SamplingParams(max_tokens=8, temperature=0.0, logit_bias={10_000: 5.0})
    output = worker.execute_step(step(worker, new("good", 20), new("bad", 30, bad), finished=["ref"]))
    assert output.req_ids == ["good"] and output.sampled_token_ids == alone.sampled_token_ids
    assert output.failed == [FailedRequest("bad", "logit_bias: token id 10000 is out of the vocabulary (size 101)",
                                           invalid_argument=True)]
    assert "bad" not in worker.requests
    after = worker.execute_step(step(worker, cached=[CachedRequest("good", [], 5)]))  # the step-mate goes on
    assert after.req_ids == ["good"] and after.failed == []
    worker.execute_step(step(worker, finished=["good"]))


def test_block_ids_past_the_pool_and_unknown_mirrors_fail_alone(worker):
    past = NewRequest("past", [5, 6, 7], 3, GREEDY, [worker.limits.num_kv_blocks], 0)
    output = worker.execute_step(step(worker, new("fine", 40), past, cached=[CachedRequest("ghost", [], 3)]))
    assert output.req_ids == ["fine"]
    assert {f.req_id: f.invalid_argument for f in output.failed} == {"past": False, "ghost": False}
    assert "outside the KV pool" in output.failed[0].message
    worker.execute_step(step(worker, finished=["fine"]))


def test_non_finite_logits_fail_their_request_alone(worker, monkeypatch):
    compute_logits = worker.runner.model.compute_logits

    def poisoned(hidden, rows):
        logits = compute_logits(hidden, rows)
        logits[1] = float("nan")  # the second sampling row
        return logits

    monkeypatch.setattr(worker.runner.model, "compute_logits", poisoned)
    output = worker.execute_step(step(worker, new("ok", 50), new("nan", 60)))
    assert output.req_ids == ["ok"] and output.failed == [FailedRequest("nan", "non-finite logits", False)]
    assert set(worker.requests) == {"ok"}
    worker.execute_step(step(worker, finished=["ok"]))


def test_a_sampler_error_on_one_row_spares_the_others(worker, monkeypatch):
    build = model_runner.build_sampling_batch

    def fragile(rows, vocab_size, device):
        if any(row.params.seed == 666 for row in rows):
            raise RuntimeError("cannot sample this one")
        return build(rows, vocab_size, device)

    monkeypatch.setattr(model_runner, "build_sampling_batch", fragile)
    cursed = SamplingParams(max_tokens=8, temperature=0.5, seed=666)
    output = worker.execute_step(step(worker, new("fine", 70), new("cursed", 80, cursed), new("also", 90)))
    assert output.req_ids == ["fine", "also"]
    assert output.failed == [FailedRequest("cursed", "sampling failed: RuntimeError", False)]
    assert all(0 <= t < 101 for t in output.sampled_token_ids)
    worker.execute_step(step(worker, finished=["fine", "also"]))
