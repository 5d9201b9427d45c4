"""Scheduler policy against the fake worker: budget, chunking, ordering, prefix hits, preemption, admission, stats.

Every scenario ends with the KV integrity check; block ids, ref counts and queue orders are asserted exactly.
"""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.request import RequestStatus
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.sampling_params import SamplingParams
from pagedserve.shared.step_protocol import CachedRequest, NewRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config, req_ids

# --- token budget and chunking -----------------------------------------------------------------------------

def test_long_prompt_is_split_into_chunks_of_the_budget():
    h = Harness(make_config(max_num_batched_tokens=8), describe(num_blocks=16, block_size=4), scripts={"a": [5, 6]})
    h.add(gen("a", list(range(1, 21)), max_tokens=2))
    first, outputs = h.step()
    assert first.step_input.num_scheduled_tokens == {"a": 8}
    assert first.step_input.new_requests == [NewRequest("a", list(range(1, 21)), 20, SamplingParams(max_tokens=2),
                                                        [0, 1], 0)]
    assert outputs == []
    second, outputs = h.step()
    assert second.step_input.cached_requests == [CachedRequest("a", [2, 3], 8)]
    assert second.step_input.num_scheduled_tokens == {"a": 8}
    assert outputs == []
    third, outputs = h.step()
    assert third.step_input.cached_requests == [CachedRequest("a", [4], 16)]
    assert third.step_input.num_scheduled_tokens == {"a": 4}
    assert [(o.req_id, o.new_token_ids, o.num_output_tokens) for o in outputs] == [("a", [5], 1)]
    fourth, outputs = h.step()
    assert fourth.step_input.cached_requests == [CachedRequest("a", [5], 20)]  # position 20 opens block 5
    assert h.kv.block_ids("a") == []  # finished: max_tokens=2
    assert list(h.kv.pool.free_queue) == [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 3, 2, 1, 0]
    assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([6], FinishReason.LENGTH)]
    assert h.worker.steps[-1].num_scheduled_tokens == {"a": 1}
    h.kv.check_integrity()


def test_a_prompt_whose_rest_passes_the_budget_by_at_most_the_slack_is_finished_in_the_step():
    """Two 6-token prompts under a budget of 10: without slack the second leaves a 2-token tail (its first token
    comes a step later); with a slack of 2 it is finished in the first step (12 tokens), with 1 it is not."""
    for slack, first_step, samples in ((0, {"a": 6, "b": 4}, ["a"]), (1, {"a": 6, "b": 4}, ["a"]),
                                       (2, {"a": 6, "b": 6}, ["a", "b"])):
        h = Harness(make_config(max_num_batched_tokens=10, prefill_finish_slack=slack),
                    describe(num_blocks=16, block_size=4))
        h.add(gen("a", list(range(1, 7)), max_tokens=2))
        h.add(gen("b", list(range(11, 17)), max_tokens=2))
        first, outputs = h.step()
        assert first.step_input.num_scheduled_tokens == first_step
        assert sorted(o.req_id for o in outputs) == samples
        h.run()
        assert all(len(h.streams[r].token_ids) == 2 for r in ("a", "b"))
        h.kv.check_integrity()


def test_the_default_finish_slack_is_an_eighth_of_the_budget():
    assert SchedulerConfig(max_num_batched_tokens=512).finish_slack == 64
    assert SchedulerConfig(max_num_batched_tokens=512, prefill_finish_slack=0).finish_slack == 0


def test_decode_after_chunked_prefill_gets_a_new_block_at_the_boundary():
    h = Harness(make_config(max_num_batched_tokens=8), describe(num_blocks=16, block_size=4))
    h.add(gen("a", list(range(1, 9)), max_tokens=3))
    first, _ = h.step()
    assert first.step_input.new_requests[0].block_ids == [0, 1]
    second, _ = h.step()
    assert second.step_input.cached_requests == [CachedRequest("a", [2], 8)]
    third, _ = h.step()
    assert third.step_input.cached_requests == [CachedRequest("a", [], 9)]
    h.run()
    assert h.streams["a"].finish_reason is FinishReason.LENGTH
    assert len(h.streams["a"].token_ids) == 3
    h.kv.check_integrity()


def test_decodes_first_then_the_continuing_prefill_then_admissions():
    h = Harness(make_config(max_num_batched_tokens=10), describe(num_blocks=32, block_size=4))
    h.add(gen("a", [1, 2, 3, 4], max_tokens=10))
    h.step()
    h.add(gen("b", list(range(10, 22)), max_tokens=10))  # 12 tokens: 9 now, 3 next step
    second, _ = h.step()
    assert list(second.step_input.num_scheduled_tokens.items()) == [("a", 1), ("b", 9)]
    h.add(gen("c", [30, 31, 32], max_tokens=10))
    h.add(gen("d", [40, 41, 42, 43, 44, 45, 46], max_tokens=10))  # 7 tokens, 3 fit: the rest next step
    third, _ = h.step()
    assert list(third.step_input.num_scheduled_tokens.items()) == [("a", 1), ("b", 3), ("c", 3), ("d", 3)]
    assert req_ids(third.step_input.cached_requests) == ["a", "b"]
    assert req_ids(third.step_input.new_requests) == ["c", "d"]
    assert third.step_input.total_num_scheduled_tokens == 10
    fourth, _ = h.step()
    # a, b and c decode; d continues its prefill with what is left
    assert list(fourth.step_input.num_scheduled_tokens.items()) == [("a", 1), ("b", 1), ("c", 1), ("d", 4)]
    assert req_ids(h.scheduler.running) == ["a", "b", "c", "d"]
    h.run()
    h.kv.check_integrity()


def test_admissions_stop_at_max_num_seqs():
    h = Harness(make_config(max_num_seqs=2), describe(num_blocks=32, block_size=4))
    for name in "abc":
        h.add(gen(name, [1, 2, 3], salt=name, max_tokens=2 if name == "a" else 3))
    first, _ = h.step()
    assert list(first.step_input.num_scheduled_tokens) == ["a", "b"]
    assert req_ids(h.scheduler.waiting) == ["c"]
    assert h.scheduler.snapshot_stats().num_running == 2
    second, _ = h.step()  # a finishes here (2 tokens), so c can enter the step after
    assert list(second.step_input.num_scheduled_tokens) == ["a", "b"]
    third, _ = h.step()
    assert list(third.step_input.num_scheduled_tokens.items()) == [("b", 1), ("c", 3)]
    assert third.step_input.finished_req_ids == ["a"]
    h.run()
    h.kv.check_integrity()


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    h = Harness(make_config(max_num_batched_tokens=8, enable_chunked_prefill=False), describe(num_blocks=32))
    h.add(gen("a", [1, 2, 3], max_tokens=3))
    h.step()
    h.add(gen("b", list(range(10, 18)), max_tokens=1))  # 8 tokens: never split, so not with a's decode
    h.add(gen("c", [20], max_tokens=1))  # first come, first served: c waits behind b
    second, _ = h.step()
    assert second.step_input.num_scheduled_tokens == {"a": 1}
    assert req_ids(h.scheduler.waiting) == ["b", "c"]
    h.step()  # a's last token
    fourth, _ = h.step()
    assert fourth.step_input.num_scheduled_tokens == {"b": 8}
    fifth, _ = h.step()
    assert fifth.step_input.num_scheduled_tokens == {"c": 1}
    h.run()
    h.kv.check_integrity()


def test_head_of_line_request_that_does_not_fit_blocks_later_ones():
    h = Harness(make_config(max_num_batched_tokens=64), describe(num_blocks=6, block_size=4))
    h.add(gen("a", list(range(1, 13)), max_tokens=4))  # 3 blocks now, 4 at most
    h.step()
    h.add(gen("big", list(range(20, 36)), max_tokens=1))  # 4 blocks: only 3 free
    h.add(gen("small", [40], max_tokens=1))
    second, _ = h.step()
    assert second.step_input.num_scheduled_tokens == {"a": 1}
    assert req_ids(h.scheduler.waiting) == ["big", "small"]
    h.run()
    assert [h.streams[n].finish_reason for n in ("a", "big", "small")] == [FinishReason.LENGTH] * 3
    h.kv.check_integrity()


# --- prefix hits through the scheduler ---------------------------------------------------------------------

def test_prefix_hit_skips_cached_blocks_and_is_reported():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4))
    h.add(gen("a", list(range(1, 11)), max_tokens=1))
    h.run()
    h.add(gen("b", list(range(1, 9)) + [50, 51, 52], max_tokens=1))
    scheduled, outputs = h.step()
    (new,) = scheduled.step_input.new_requests
    assert (new.block_ids, new.num_computed_tokens) == ([0, 1, 3], 8)  # a freed 2, 1, 0 to the tail
    assert scheduled.step_input.num_scheduled_tokens == {"b": 3}
    assert (outputs[0].num_cached_tokens, outputs[0].num_prompt_tokens) == (8, 11)
    h.run()
    h.kv.check_integrity()


def test_prefix_hit_counts_only_the_tokens_left_against_the_budget():
    h = Harness(make_config(max_num_batched_tokens=4), describe(num_blocks=16, block_size=4))
    h.add(gen("a", list(range(1, 14)), max_tokens=1))
    assert h.run() == 5  # 4 + 4 + 4 + 1 tokens, then the step that tells the worker a finished
    h.add(gen("b", list(range(1, 14)), max_tokens=1))
    scheduled, outputs = h.step()
    assert scheduled.step_input.num_scheduled_tokens == {"b": 1}
    assert scheduled.step_input.new_requests[0].num_computed_tokens == 12
    assert outputs[0].finish_reason is FinishReason.LENGTH
    assert h.streams["b"].token_ids == h.streams["a"].token_ids
    h.run()
    h.kv.check_integrity()


# --- preemption --------------------------------------------------------------------------------------------

def preemption_setup(caching: bool) -> Harness:
    """Three 4-token prompts fill a 6-block pool (block size 2); the first decodes need blocks."""
    h = Harness(make_config(max_num_batched_tokens=64, enable_prefix_caching=caching),
                describe(num_blocks=6, block_size=2, max_model_len=64))
    for name in "abc":
        h.add(gen(name, [10 + i for i in range(4)], salt=name, max_tokens=4))
    first, _ = h.step()
    assert first.step_input.num_scheduled_tokens == {"a": 4, "b": 4, "c": 4}
    assert [h.kv.block_ids(n) for n in "abc"] == [[0, 1], [2, 3], [4, 5]]
    h.add(gen("d", [30], max_tokens=1))
    return h


def test_decode_without_a_block_preempts_the_newest_running_request():
    h = preemption_setup(caching=False)
    scheduled, _ = h.step()
    assert scheduled.preempted_req_ids == ["c"]
    assert scheduled.step_input.num_scheduled_tokens == {"a": 1, "b": 1}  # d is not admitted in this step
    assert scheduled.step_input.finished_req_ids == ["c"]  # the worker drops c's mirror
    assert h.kv.block_ids("a") == [0, 1, 5]  # c freed 5 then 4: its tail block is reused first
    assert h.kv.block_ids("b") == [2, 3, 4]
    assert req_ids(h.scheduler.waiting) == ["c", "d"]  # the preempted request goes first
    c = h.scheduler.requests["c"]
    assert (c.status, c.num_computed_tokens, c.num_preemptions, c.on_worker) == (RequestStatus.PREEMPTED, 0, 1,
                                                                                    False)
    assert c.num_output_tokens == 1
    stats = h.scheduler.snapshot_stats()
    assert (stats.num_preemptions, stats.num_running, stats.num_waiting, stats.kv_usage) == (1, 2, 2, 1.0)
    h.kv.check_integrity()


def test_preempted_request_resumes_with_its_outputs_and_the_same_results():
    alone = Harness(make_config(), describe(num_blocks=64, block_size=2, max_model_len=64))
    alone.add(gen("c", [10, 11, 12, 13], salt="c", max_tokens=4))
    alone.run()

    h = preemption_setup(caching=False)
    h.step()  # step 2: c is preempted after one output
    c_tokens = list(h.scheduler.requests["c"].token_ids)
    assert c_tokens == [10, 11, 12, 13, alone.streams["c"].token_ids[0]]
    h.step()  # step 3: a and b decode; c does not fit yet
    fourth, _ = h.step()  # a needs its 4th block: b is now the newest and goes, ahead of c
    assert fourth.preempted_req_ids == ["b"]
    assert req_ids(h.scheduler.waiting) == ["b", "c", "d"]
    b_tokens = list(h.scheduler.requests["b"].token_ids)
    fifth, _ = h.step()  # a finished; b resumes from scratch with its 3 tokens of output
    assert fifth.step_input.new_requests == [NewRequest("b", b_tokens, 4, SamplingParams(max_tokens=4),
                                                        [3, 2, 4, 5], 0)]
    assert len(b_tokens) == 7
    sixth, _ = h.step()  # b finished; c resumes, d fits beside it
    assert sixth.step_input.num_scheduled_tokens == {"c": 5, "d": 1}
    assert sixth.step_input.new_requests == [
        NewRequest("c", c_tokens, 4, SamplingParams(max_tokens=4), [1, 0, 5], 0),  # prompt + its earlier output
        NewRequest("d", [30], 1, SamplingParams(max_tokens=1), [4], 0)]
    h.run()
    assert h.streams["c"].token_ids == alone.streams["c"].token_ids
    assert [o.num_output_tokens for o in h.streams["c"].outputs] == [1, 2, 3, 4]  # no output repeated or lost
    assert [h.streams[n].finish_reason for n in "abcd"] == [FinishReason.LENGTH] * 4
    assert (h.scheduler.requests, h.scheduler.snapshot_stats().num_preemptions) == ({}, 2)
    assert h.kv.usage == 0.0
    h.kv.check_integrity()


def test_resumed_request_hits_its_own_cached_blocks():
    h = Harness(make_config(max_num_batched_tokens=64), describe(num_blocks=6, block_size=2, max_model_len=64))
    h.add(gen("a", [1, 2, 3], max_tokens=3))  # blocks 0, 1
    h.add(gen("c", [5, 6, 7, 8, 9, 10], max_tokens=4))  # blocks 2, 3, 4
    h.step()
    h.step()  # c's 7th token takes block 5, the last
    third, _ = h.step()  # a needs a 3rd block: c goes; its 3 full blocks stay cached, a takes unkeyed block 5
    assert third.preempted_req_ids == ["c"]
    assert h.kv.block_ids("a") == []  # and a finished (3 outputs)
    assert list(h.kv.pool.free_queue) == [4, 3, 2, 5, 1, 0]
    c_tokens = list(h.scheduler.requests["c"].token_ids)
    fourth, _ = h.step()
    assert fourth.step_input.new_requests == [NewRequest("c", c_tokens, 6, SamplingParams(max_tokens=4),
                                                         [2, 3, 4, 5], 6)]
    assert fourth.step_input.num_scheduled_tokens == {"c": 2}
    assert [b.ref_count for b in h.kv.pool.blocks] == [0, 0, 1, 1, 1, 1]
    stats = h.scheduler.snapshot_stats()
    # the resumption's own 6-token hit is not counted: only first admissions are (a: 3 tokens, c: 6)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.prefix_cache_evictions) == (9, 0, 0)
    h.run()
    assert len(h.streams["c"].token_ids) == 4
    h.kv.check_integrity()


def test_the_newest_running_request_preempts_itself():
    h = Harness(make_config(max_num_batched_tokens=64), describe(num_blocks=4, block_size=2, max_model_len=64))
    h.add(gen("a", [1, 2, 3], max_tokens=4))  # 2 blocks, the 2nd half full
    h.add(gen("b", [5, 6, 7, 8], salt="b", max_tokens=4))  # 2 blocks, full
    h.step()
    scheduled, _ = h.step()  # a decodes into its 2nd block; b needs a 3rd block: none free, b is newest
    assert scheduled.preempted_req_ids == ["b"]
    assert scheduled.step_input.num_scheduled_tokens == {"a": 1}
    assert req_ids(h.scheduler.running) == ["a"]
    assert req_ids(h.scheduler.waiting) == ["b"]
    assert list(h.kv.pool.free_queue) == [3, 2]
    h.kv.check_integrity()
    h.run()
    assert [h.streams[n].finish_reason for n in "ab"] == [FinishReason.LENGTH] * 2
    h.kv.check_integrity()


def test_several_victims_are_requeued_in_admission_order():
    h = Harness(make_config(max_num_batched_tokens=64), describe(num_blocks=6, block_size=2, max_model_len=64))
    h.add(gen("a", [1, 2, 3, 4], max_tokens=4))  # blocks 0, 1
    for i, name in enumerate("bcd"):
        h.add(gen(name, [5 + i, 6], max_tokens=4))  # blocks 2, 3, 4
    h.step()
    assert list(h.kv.pool.free_queue) == [5]
    h.add(gen("e", [11], max_tokens=1))
    # step 2: a takes block 5; b needs one: d goes (block 4 to b); c needs one: c is now the newest and goes
    scheduled, _ = h.step()
    assert scheduled.preempted_req_ids == ["d", "c"]
    assert req_ids(h.scheduler.running) == ["a", "b"]
    assert req_ids(h.scheduler.waiting) == ["c", "d", "e"]
    assert scheduled.step_input.num_scheduled_tokens == {"a": 1, "b": 1}
    assert scheduled.step_input.finished_req_ids == ["d", "c"]
    assert (h.kv.block_ids("a"), h.kv.block_ids("b")) == ([0, 1, 5], [2, 4])
    assert list(h.kv.pool.free_queue) == [3]
    assert h.scheduler.snapshot_stats().num_preemptions == 2
    h.kv.check_integrity()
    h.run()
    assert all(h.streams[n].finish_reason is FinishReason.LENGTH for n in "abcde")
    h.kv.check_integrity()

def test_abort_of_a_preempted_request_is_not_sent_to_the_worker_twice():
    h = preemption_setup(caching=False)
    scheduled, _ = h.step()
    assert scheduled.step_input.finished_req_ids == ["c"]
    assert h.abort("c") is True
    assert req_ids(h.scheduler.waiting) == ["d"]
    assert h.scheduler.finished_req_ids == []
    h.run()
    assert h.streams["c"].finish_reason is FinishReason.ABORT
    assert h.kv.usage == 0.0
    h.kv.check_integrity()


# --- admission: the watermark, and prefills longer than a step -------------------------------------------

def test_a_request_that_fills_the_pool_runs_despite_the_watermark():
    # 10 blocks, watermark 0.2 (2 blocks): 37 prompt tokens need all 10 blocks with their outputs
    h = Harness(SchedulerConfig(watermark=0.2), describe(num_blocks=10, block_size=4, max_model_len=64))
    h.add(gen("r", list(range(1, 38)), max_tokens=3))
    first, _ = h.step()  # nothing else runs, so there is no decode for the watermark to protect
    assert first.step_input.new_requests[0].block_ids == list(range(10))
    h.run(max_steps=10)
    assert h.streams["r"].finish_reason is FinishReason.LENGTH
    h.kv.check_integrity()


def test_the_watermark_holds_back_admissions_while_requests_run():
    h = Harness(SchedulerConfig(watermark=0.2), describe(num_blocks=10, block_size=4, max_model_len=64))
    h.add(gen("a", [1, 2, 3, 4], max_tokens=6))  # 1 block now, 3 at most
    h.step()
    h.add(gen("b", list(range(10, 35)), max_tokens=1))  # 7 blocks + 2 reserved > 9 free
    scheduled, _ = h.step()
    assert scheduled.step_input.num_scheduled_tokens == {"a": 1}
    assert req_ids(h.scheduler.waiting) == ["b"]
    h.run()
    assert h.streams["b"].finish_reason is FinishReason.LENGTH
    h.kv.check_integrity()


def test_resumed_request_longer_than_the_budget_runs_without_chunked_prefill():
    # budget 8, chunking off: c's 4-token prompt fits, but after the preemption it is prompt + outputs
    h = Harness(make_config(max_num_batched_tokens=8, enable_chunked_prefill=False, enable_prefix_caching=False),
                describe(num_blocks=8, block_size=2, max_model_len=64))
    h.add(gen("a", [1, 2], max_tokens=12))
    h.add(gen("c", [10, 11, 12, 13], max_tokens=8))
    for _ in range(6):
        scheduled, _ = h.step()
    assert scheduled.preempted_req_ids == ["c"]  # at step 6 a and c need 4 + 5 blocks
    assert h.scheduler.requests["c"].num_tokens == 9  # more than a step holds
    scheduled, _ = h.step()
    assert scheduled.step_input.num_scheduled_tokens == {"a": 1, "c": 7}  # resumed in chunks after all
    assert [(r.req_id, len(r.token_ids), r.num_computed_tokens) for r in scheduled.step_input.new_requests] == [
        ("c", 9, 0)]
    scheduled, _ = h.step()
    assert scheduled.preempted_req_ids == ["c"]  # a grows into its 5th block: c goes again
    h.run(max_steps=60)
    assert h.scheduler.snapshot_stats().num_preemptions == 2
    assert [h.streams[n].finish_reason for n in "ac"] == [FinishReason.LENGTH] * 2
    assert max(s.total_num_scheduled_tokens for s in h.worker.steps) <= 8
    h.kv.check_integrity()

# --- stats -------------------------------------------------------------------------------------------------

def test_stats_snapshot_counts_everything():
    h = Harness(make_config(max_num_batched_tokens=6, max_num_seqs=2), describe(num_blocks=10, block_size=4),
                scripts={"b": [0]})
    h.add(gen("a", [1, 2, 3, 4, 5], max_tokens=3))
    h.add(gen("b", [1, 2, 3, 4, 9], salt="b", max_tokens=3))  # salted: no prefix shared with a, so no deferral
    h.add(gen("c", [8, 8], max_tokens=3))
    stats = h.scheduler.snapshot_stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage, stats.num_steps) == (0, 3, 0.0, 0)
    h.step()  # a: 5 tokens, b: a chunk of 1
    stats = h.scheduler.snapshot_stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (2, 1, pytest.approx(0.3))
    assert (h.scheduler.counters.num_scheduled_tokens_last_step, stats.num_scheduled_tokens_total) == (6, 6)
    h.step()  # a: 1, b: 4 more; b samples EOS
    stats = h.scheduler.snapshot_stats()
    assert (stats.num_running, stats.num_waiting, stats.num_finished) == (1, 1, {"stop": 1})
    assert (h.scheduler.counters.num_scheduled_tokens_last_step, stats.num_scheduled_tokens_total,
            stats.num_steps) == (5, 11, 2)
    assert stats.kv_usage == pytest.approx(0.2)
    h.run()
    stats = h.scheduler.snapshot_stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (0, 0, 0.0)
    assert stats.num_finished == {"stop": 1, "length": 2}
    assert (stats.num_prompt_tokens_total, stats.num_generation_tokens_total, stats.num_kv_blocks) == (12, 7, 10)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (12, 0)
    assert (stats.num_preemptions, stats.num_prefix_deferrals) == (0, 0)
    h.kv.check_integrity()


def test_snapshot_is_a_copy():
    h = Harness(make_config(), describe())
    h.add(gen("a", [1, 2], max_tokens=1))
    before = h.scheduler.snapshot_stats()
    h.run()
    assert before.num_finished == {}
    assert before.num_steps == 0
    h.kv.check_integrity()
