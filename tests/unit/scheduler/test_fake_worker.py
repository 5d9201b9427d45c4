"""The fake worker's own checks: each protocol or KV-sharing violation it exists to catch raises."""

from __future__ import annotations

import pytest

from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import CachedRequest, NewRequest, StepInput
from tests.support.fake_worker import FakeWorker, FakeWorkerError, describe

PARAMS = SamplingParams(max_tokens=8)


def new(req_id: str, tokens: list[int], block_ids: list[int], computed: int = 0) -> NewRequest:
    return NewRequest(req_id, tokens, len(tokens), PARAMS, block_ids, computed)


def step(new_requests=(), cached=(), scheduled=None, finished=()) -> StepInput:
    return StepInput(list(new_requests), list(cached), dict(scheduled or {}), list(finished))


def worker_with_a() -> FakeWorker:
    """Request a: prompt [1..6] computed in blocks 0, 1 (block size 4), one token sampled."""
    worker = FakeWorker(describe(num_blocks=8, block_size=4))
    out = worker.execute_step(step([new("a", [1, 2, 3, 4, 5, 6], [0, 1])], scheduled={"a": 6}))
    assert out.req_ids == ["a"]
    return worker


def test_samples_only_at_the_end_of_the_known_tokens_and_keeps_the_mirror():
    worker = FakeWorker(describe(num_blocks=8, block_size=4))
    out = worker.execute_step(step([new("a", [1, 2, 3, 4, 5, 6], [0, 1])], scheduled={"a": 4}))
    assert out.req_ids == []
    out = worker.execute_step(step(cached=[CachedRequest("a", [], 4)], scheduled={"a": 2}))
    assert out.req_ids == ["a"]
    mirror = worker.mirrors["a"]
    assert (mirror.num_computed_tokens, mirror.token_ids[-1], len(mirror.token_ids)) == (6, out.sampled_token_ids[0],
                                                                                          7)


def test_next_token_depends_on_the_history_not_the_request_id():
    worker = FakeWorker(describe(num_blocks=8, block_size=4))
    out = worker.execute_step(step([new("a", [1, 2, 3], [0]), new("b", [1, 2, 3], [1]), new("c", [1, 2, 4], [2])],
                                   scheduled={"a": 3, "b": 3, "c": 3}))
    tokens = dict(zip(out.req_ids, out.sampled_token_ids, strict=True))
    assert tokens["a"] == tokens["b"]
    assert tokens["a"] != tokens["c"]


def test_prefix_hit_reading_the_right_content_is_accepted():
    worker = worker_with_a()
    worker.execute_step(step([new("b", [1, 2, 3, 4, 9], [0, 2], computed=4)], scheduled={"b": 1}))
    assert worker.mirrors["b"].num_computed_tokens == 5


def test_prefix_hit_on_a_block_with_other_content_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match=r"request b reads stale KV at position 3 \(slot 3, block 0\)"):
        worker.execute_step(step([new("b", [1, 2, 3, 5, 9], [0, 2], computed=4)], scheduled={"b": 1}))


def test_hit_on_a_block_from_a_different_position_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="reads stale KV at position 0"):
        worker.execute_step(step([new("b", [1, 2, 3, 4, 5, 6, 7], [1, 2], computed=4)], scheduled={"b": 3}))


def test_writing_into_a_block_another_live_request_holds_is_caught():
    worker = worker_with_a()
    message = r"request b overwrites slot 4 \(block 1\) that live request\(s\) \['a'\] also hold"
    with pytest.raises(FakeWorkerError, match=message):
        worker.execute_step(step([new("b", [7, 7, 7, 7, 7], [2, 1])], scheduled={"b": 5}))


def test_a_block_of_a_dropped_request_may_be_reused():
    worker = worker_with_a()
    worker.execute_step(step([new("b", [7, 7, 7, 7, 7], [2, 1])], scheduled={"b": 5}, finished=["a"]))
    assert set(worker.mirrors) == {"b"}


def test_cached_request_unknown_to_the_worker_is_caught():
    worker = FakeWorker(describe())
    with pytest.raises(FakeWorkerError, match="request x sent as cached but unknown to the worker"):
        worker.execute_step(step(cached=[CachedRequest("x", [], 0)], scheduled={"x": 1}))


def test_disagreeing_computed_tokens_are_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="request a: worker computed 6 tokens, scheduler says 5"):
        worker.execute_step(step(cached=[CachedRequest("a", [], 5)], scheduled={"a": 1}))


def test_blocks_that_cannot_hold_the_scheduled_tokens_are_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="request a: 2 blocks cannot hold 9 tokens"):
        worker.mirrors["a"].token_ids.extend([5, 5])  # pretend two more tokens are known
        worker.execute_step(step(cached=[CachedRequest("a", [], 6)], scheduled={"a": 3}))


def test_scheduling_past_the_known_tokens_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="request a: 2 tokens scheduled after 6 computed of 7 known"):
        worker.execute_step(step(cached=[CachedRequest("a", [2], 6)], scheduled={"a": 2}))


def test_scheduled_but_not_sent_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match=r"sent \[\] but scheduled \['a'\]"):
        worker.execute_step(step(scheduled={"a": 1}))


def test_new_request_for_a_live_mirror_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="request a sent as new while the worker still mirrors it"):
        worker.execute_step(step([new("a", [1, 2], [3])], scheduled={"a": 2}))


def test_a_request_twice_in_one_step_is_caught():
    worker = worker_with_a()
    with pytest.raises(FakeWorkerError, match="a request appears twice in one step"):
        worker.execute_step(step([new("b", [1], [3])], [CachedRequest("b", [], 0)], scheduled={"b": 1}))


def test_a_block_held_twice_by_one_request_or_outside_the_pool_is_caught():
    with pytest.raises(FakeWorkerError, match=r"request b holds a block twice: \[3, 3\]"):
        FakeWorker(describe(num_blocks=8)).execute_step(step([new("b", [1] * 6, [3, 3])], scheduled={"b": 6}))
    with pytest.raises(FakeWorkerError, match=r"request b: block ids \[8\] outside the pool"):
        FakeWorker(describe(num_blocks=8)).execute_step(step([new("b", [1] * 6, [3, 8])], scheduled={"b": 6}))


def test_positions_beyond_the_context_limit_are_caught():
    worker = FakeWorker(describe(num_blocks=8, block_size=4, max_model_len=4))
    with pytest.raises(FakeWorkerError, match="position 4 beyond the context limit"):
        worker.execute_step(step([new("a", [1, 2, 3, 4, 5], [0, 1])], scheduled={"a": 5}))


def test_script_forces_outputs_by_output_index_and_min_tokens_bans_stops():
    worker = FakeWorker(describe(num_blocks=8, block_size=4), eos_prob=1.0, scripts={"a": [42]})
    out = worker.execute_step(step([new("a", [1, 2], [0])], scheduled={"a": 2}))
    assert out.sampled_token_ids == [42]
    out = worker.execute_step(step(cached=[CachedRequest("a", [], 2)], scheduled={"a": 1}))
    assert out.sampled_token_ids == [0]  # past the script: EOS with probability 1
    banned = NewRequest("b", [1, 2], 2, SamplingParams(max_tokens=8, min_tokens=1), [1], 0)
    out = worker.execute_step(step([banned], scheduled={"b": 2}))
    assert out.sampled_token_ids == [1]  # EOS (0) is banned before min_tokens: the next id instead
