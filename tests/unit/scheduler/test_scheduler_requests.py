"""Request lifecycle against the fake worker: stop conditions, aborts, and rejection of requests that can never run.

Every scenario ends with the KV integrity check; block ids and queue orders are asserted exactly.
"""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.step_protocol import FailedRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config, req_ids

# --- stop conditions ---------------------------------------------------------------------------------------

def run_one(request, eos_prob: float = 0.0, scripts=None, **describe_overrides) -> Harness:
    h = Harness(make_config(), describe(**{"num_blocks": 32, **describe_overrides}), eos_prob=eos_prob, scripts=scripts)
    h.add(request)
    h.run()
    h.kv.check_integrity()
    return h


def test_max_tokens_stops_with_length():
    h = run_one(gen("a", [1, 2, 3], max_tokens=5), scripts={"a": [7, 8, 9, 10, 11, 12]})
    assert h.streams["a"].token_ids == [7, 8, 9, 10, 11]
    assert h.streams["a"].finish_reason is FinishReason.LENGTH
    assert h.scheduler.snapshot_stats().num_finished == {"length": 1}


def test_eos_stops_and_is_the_last_output():
    h = run_one(gen("a", [1, 2, 3], max_tokens=5), scripts={"a": [7, 0, 9]})
    assert h.streams["a"].token_ids == [7, 0]
    assert h.streams["a"].finish_reason is FinishReason.STOP
    assert h.scheduler.snapshot_stats().num_finished == {"stop": 1}


def test_ignore_eos_runs_to_max_tokens():
    h = run_one(gen("a", [1, 2, 3], max_tokens=4, ignore_eos=True), scripts={"a": [0, 0, 5, 0]})
    assert h.streams["a"].token_ids == [0, 0, 5, 0]
    assert h.streams["a"].finish_reason is FinishReason.LENGTH


def test_min_tokens_holds_off_eos_and_stop_tokens():
    h = run_one(gen("a", [1, 2, 3], max_tokens=8, min_tokens=3, stop_token_ids=(42,)),
                scripts={"a": [0, 42, 5, 0]})
    assert h.streams["a"].token_ids == [0, 42, 5, 0]
    assert h.streams["a"].finish_reason is FinishReason.STOP


def test_min_tokens_counts_the_token_just_sampled():
    h = run_one(gen("a", [1, 2, 3], max_tokens=8, min_tokens=2), scripts={"a": [4, 0, 5]})
    assert h.streams["a"].token_ids == [4, 0]
    assert h.streams["a"].finish_reason is FinishReason.STOP


def test_stop_token_ids_stop_even_when_eos_is_ignored():
    h = run_one(gen("a", [1, 2, 3], max_tokens=8, ignore_eos=True, stop_token_ids=(42, 43)),
                scripts={"a": [0, 5, 43, 7]})
    assert h.streams["a"].token_ids == [0, 5, 43]
    assert h.streams["a"].finish_reason is FinishReason.STOP


def test_context_limit_stops_with_length():
    h = run_one(gen("a", list(range(1, 9)), max_tokens=10), max_model_len=12)
    assert len(h.streams["a"].token_ids) == 4  # 8 + 4 == 12 tokens: no position left to compute
    assert h.streams["a"].finish_reason is FinishReason.LENGTH
    assert max(s.total_num_scheduled_tokens for s in h.worker.steps) == 8


def test_finish_frees_blocks_at_once_and_tells_the_worker_next_step():
    h = Harness(make_config(), describe(num_blocks=8, block_size=4), scripts={"a": [5, 0]})
    h.add(gen("a", [1, 2, 3, 4, 5], max_tokens=4))
    h.add(gen("b", [9, 9, 9], max_tokens=4))
    h.step()
    _, outputs = h.step()
    assert [(o.req_id, o.finish_reason) for o in outputs] == [("a", FinishReason.STOP), ("b", None)]
    assert h.kv.block_ids("a") == []
    assert list(h.kv.pool.free_queue) == [3, 4, 5, 6, 7, 1, 0]
    assert h.scheduler.finished_req_ids == ["a"]
    assert set(h.worker.mirrors) == {"a", "b"}
    scheduled, _ = h.step()
    assert scheduled.step_input.finished_req_ids == ["a"]
    assert set(h.worker.mirrors) == {"b"}
    assert "a" not in h.scheduler.requests
    h.run()
    assert h.worker.mirrors == {}
    h.kv.check_integrity()


def test_outputs_are_deltas_with_running_counts():
    h = Harness(make_config(max_num_batched_tokens=4), describe(num_blocks=8, block_size=4), scripts={"a": [7, 8, 9]})
    h.add(gen("a", [1, 2, 3, 4, 5, 6], max_tokens=3))
    h.run()
    assert [(o.new_token_ids, o.num_output_tokens, o.finish_reason, o.num_prompt_tokens, o.num_cached_tokens)
            for o in h.streams["a"].outputs] == [([7], 1, None, 6, 0), ([8], 2, None, 6, 0),
                                                 ([9], 3, FinishReason.LENGTH, 6, 0)]
    h.kv.check_integrity()


# --- aborts ------------------------------------------------------------------------------------------------

def test_abort_of_a_waiting_request_never_reaches_the_worker():
    h = Harness(make_config(max_num_seqs=1), describe(num_blocks=8))
    h.add(gen("a", [1, 2], max_tokens=3))
    h.add(gen("b", [3, 4], max_tokens=3))
    h.step()
    assert h.abort("b") is True
    assert req_ids(h.scheduler.waiting) == []
    assert h.scheduler.finished_req_ids == []
    assert h.abort("b") is False
    assert h.abort("nobody") is False
    h.run()
    assert all("b" not in s.num_scheduled_tokens for s in h.worker.steps)
    assert h.scheduler.snapshot_stats().num_finished == {"abort": 1, "length": 1}
    h.kv.check_integrity()


def test_abort_of_a_running_request_frees_its_blocks_at_once():
    h = Harness(make_config(), describe(num_blocks=8, block_size=4))
    h.add(gen("a", list(range(1, 10)), max_tokens=5))
    h.add(gen("b", [3, 4], max_tokens=5))
    h.step()
    assert h.kv.block_ids("a") == [0, 1, 2]
    assert h.abort("a") is True
    assert list(h.kv.pool.free_queue) == [4, 5, 6, 7, 2, 1, 0]
    assert req_ids(h.scheduler.running) == ["b"]
    h.kv.check_integrity()
    scheduled, outputs = h.step()
    assert scheduled.step_input.finished_req_ids == ["a"]
    assert list(scheduled.step_input.num_scheduled_tokens) == ["b"]
    assert "a" not in h.worker.mirrors
    assert [o.req_id for o in outputs] == ["b"]
    h.run()
    assert h.streams["a"].finish_reason is FinishReason.ABORT
    h.kv.check_integrity()


def test_abort_while_the_step_is_in_flight_drops_its_output():
    h = Harness(make_config(), describe(num_blocks=8, block_size=4))
    h.add(gen("a", [1, 2, 3], max_tokens=5))
    h.add(gen("b", [4, 5, 6], max_tokens=5))
    scheduled = h.schedule()
    step_output = h.worker.execute_step(scheduled.step_input)
    assert h.abort("a") is True  # the gateway cancels while the worker runs the step
    outputs = h.feed(scheduled, step_output)
    assert [o.req_id for o in outputs] == ["b"]
    assert h.streams["a"].token_ids == []
    assert h.kv.block_ids("a") == []
    assert list(h.kv.pool.free_queue) == [2, 3, 4, 5, 6, 7, 0]
    assert h.scheduler.finished_req_ids == ["a"]
    h.kv.check_integrity()
    h.run()
    assert h.worker.mirrors == {}
    h.kv.check_integrity()

def test_a_finished_id_can_be_reused():
    h = Harness(make_config(), describe(num_blocks=8))
    h.add(gen("a", [1, 2], max_tokens=1))
    h.step()
    h.add(gen("a", [1, 2, 3], max_tokens=1))  # the old mirror is dropped before the new one is made
    scheduled, _ = h.step()
    assert scheduled.step_input.finished_req_ids == ["a"]
    assert req_ids(scheduled.step_input.new_requests) == ["a"]
    h.run()
    h.kv.check_integrity()


# --- admission validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("prompt", "max_tokens", "message"), [
    ([], 4, "the prompt is empty"),
    (list(range(1, 33)), 4, "the prompt has 32 tokens but this model's context limit is 32 tokens "
                            "(at least one must remain for the output)"),
    (list(range(1, 40)), 4, "the prompt has 39 tokens but this model's context limit is 32 tokens "
                            "(at least one must remain for the output)"),
    (list(range(1, 30)), 4, "the request needs up to 32 tokens of KV cache (8 blocks) but the whole pool holds "
                            "28 tokens (7 blocks)"),
    ([1, 2, 97], 4, "token id 97 is out of the vocabulary (size 97)"),
    ([1, -1], 4, "token id -1 is out of the vocabulary (size 97)"),
    ([1, 2], {"logit_bias": {97: 1.0}}, "logit_bias: token id 97 is out of the vocabulary (size 97)"),
    ([1, 2], {"stop_token_ids": (5, 200)}, "stop_token_ids: token id 200 is out of the vocabulary (size 97)"),
])
def test_requests_that_can_never_run_are_rejected_with_the_reason(prompt, max_tokens, message):
    h = Harness(make_config(), describe(num_blocks=7, block_size=4, max_model_len=32))
    sampling = max_tokens if isinstance(max_tokens, dict) else {"max_tokens": max_tokens}
    with pytest.raises(RequestRejected) as info:
        h.scheduler.add_request(gen("r", prompt, **sampling))
    assert str(info.value) == message
    assert h.scheduler.requests == {}
    assert not h.scheduler.has_unfinished_requests()
    h.kv.check_integrity()


def test_the_largest_request_the_pool_can_hold_is_accepted_and_runs():
    h = Harness(make_config(), describe(num_blocks=7, block_size=4, max_model_len=32))
    h.add(gen("r", list(range(1, 25)), max_tokens=4))  # 28 tokens == 7 blocks
    h.run()
    assert len(h.streams["r"].token_ids) == 4
    h.kv.check_integrity()


def test_duplicate_request_id_is_rejected():
    h = Harness(make_config(), describe())
    h.add(gen("a", [1, 2]))
    with pytest.raises(RequestRejected, match="request id 'a' is already in use"):
        h.scheduler.add_request(gen("a", [3, 4]))
    assert req_ids(h.scheduler.waiting) == ["a"]
    h.run()
    h.kv.check_integrity()


# --- failures the worker reports ---------------------------------------------------------------------------

def test_a_request_the_worker_failed_ends_alone_with_its_error_and_its_blocks_free():
    h = Harness(make_config(enable_prefix_caching=True), describe(num_blocks=32))
    h.add(gen("ok", list(range(1, 10)), max_tokens=3))
    h.add(gen("bad", list(range(20, 30)), max_tokens=3))
    scheduled = h.schedule()
    assert scheduled.step_input.incarnation_id == h.description.incarnation_id
    output = h.worker.execute_step(scheduled.step_input)
    index = output.req_ids.index("bad")
    for name in ("req_ids", "sampled_token_ids", "logprobs"):
        del getattr(output, name)[index]
    failure = FailedRequest("bad", "non-finite logits", invalid_argument=False)
    output.failed = [failure]
    outputs = h.feed(scheduled, output)
    assert [(o.req_id, o.finish_reason, o.error) for o in outputs] == [
        ("bad", FinishReason.ERROR, failure), ("ok", None, None)]
    assert h.kv.blocks_of.keys() == {"ok"} and "bad" not in h.scheduler.requests
    assert len(h.kv.prefix_index) == 2  # ok's two full blocks; bad's two were computed but not indexed
    h.run()
    assert h.streams["ok"].finish_reason is FinishReason.LENGTH and len(h.streams["ok"].token_ids) == 3
    assert all("bad" not in step.finished_req_ids for step in h.worker.steps)  # the worker dropped it itself
    assert h.scheduler.snapshot_stats().num_finished == {"error": 1, "length": 1}
    h.kv.check_integrity()
