"""Prefix-aware admission: a waiting request whose next prefix block a running request is computing sits out steps
until that block is cached, instead of computing the same prefix a second time at once.

Every scenario checks the KV integrity (which includes the in-flight keys) after every step.
"""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.prefix_cache import InFlightKeys
from pagedserve.shared.request_io import FinishReason
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config, make_request, req_ids

PREFIX = list(range(1, 25))  # 6 blocks of 4 tokens


def run_checked(h: Harness, max_steps: int = 200) -> int:
    """Step to the end, checking KV integrity after every step; returns the prompt tokens computed in all."""
    for _ in range(max_steps):
        if not (h.scheduler.has_unfinished_requests() or h.scheduler.finished_req_ids):
            break
        h.step()
        h.kv.check_integrity()
    else:
        raise AssertionError("requests still unfinished")
    assert len(h.kv.in_flight) == 0
    return num_prompt_tokens_computed(h)


def num_prompt_tokens_computed(h: Harness) -> int:
    """Every scheduled token is a prompt token or a fed-back output (all outputs but each request's last)."""
    scheduled = sum(s.total_num_scheduled_tokens for s in h.worker.steps)
    return scheduled - sum(max(0, len(stream.token_ids) - 1) for stream in h.streams.values())


def burst(h: Harness, num: int, prefix: list[int] = PREFIX) -> None:
    for i in range(num):
        h.add(gen(f"r{i}", prefix + [60 + i, 70 + i, 80 + i], max_tokens=2))


# --- the burst: one request computes the shared prefix, the others hit it ---------------------------------

@pytest.mark.parametrize("chunked, budget", [(True, 16), (True, 512), (False, 32)])
def test_a_burst_on_a_cold_cache_computes_the_shared_prefix_once(chunked, budget):
    h = Harness(make_config(max_num_batched_tokens=budget, enable_chunked_prefill=chunked),
                describe(num_blocks=64, block_size=4))
    burst(h, 8)
    first, _ = h.step()
    assert list(first.step_input.num_scheduled_tokens) == ["r0"]  # the others wait for r0's blocks
    assert req_ids(h.scheduler.waiting) == [f"r{i}" for i in range(1, 8)]
    computed = run_checked(h)
    assert computed == len(PREFIX) + 8 * 3  # one prefix plus every suffix, instead of 8 whole prompts
    assert all(h.streams[f"r{i}"].finish_reason is FinishReason.LENGTH for i in range(8))
    assert [h.streams[f"r{i}"].outputs[0].num_cached_tokens for i in range(8)] == [0] + [24] * 7
    stats = h.scheduler.snapshot_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (8 * 27, 7 * 24)
    assert stats.num_prefix_deferrals >= 7


def test_with_prefix_caching_off_nothing_is_deferred():
    h = Harness(make_config(max_num_batched_tokens=512, enable_prefix_caching=False),
                describe(num_blocks=64, block_size=4))
    burst(h, 8)
    first, _ = h.step()
    assert len(first.step_input.num_scheduled_tokens) == 8
    assert run_checked(h) == 8 * 27
    assert h.scheduler.snapshot_stats().num_prefix_deferrals == 0


def test_the_waiter_waits_for_the_last_prefix_block_and_then_takes_the_whole_prefix():
    h = Harness(make_config(max_num_batched_tokens=10), describe(num_blocks=64, block_size=4))
    burst(h, 2)
    r1 = h.scheduler.requests["r1"]
    # r0 computes 10 tokens a step; r1 is looked at only when budget is left, and wants the block after its hit
    for num_hit, num_deferrals in ((0, 0), (8, 0), (20, 1)):
        assert len(h.kv.find_prefix(r1).blocks) * 4 == num_hit
        scheduled, _ = h.step()
        assert list(scheduled.step_input.num_scheduled_tokens) == ["r0"]
        assert h.scheduler.snapshot_stats().num_prefix_deferrals == num_deferrals
    scheduled, _ = h.step()  # r0 computed its 27 prompt tokens: all 6 prefix blocks are cached
    (new,) = scheduled.step_input.new_requests
    assert (new.req_id, new.num_computed_tokens) == ("r1", 24)
    assert scheduled.step_input.num_scheduled_tokens == {"r0": 1, "r1": 3}
    assert run_checked(h) == 24 + 2 * 3


# --- deferral does not block the queue --------------------------------------------------------------------

def test_requests_behind_a_deferred_one_are_admitted_in_the_same_step():
    h = Harness(make_config(max_num_batched_tokens=512), describe(num_blocks=64, block_size=4))
    h.add(gen("a", PREFIX + [50], max_tokens=2))
    h.add(gen("b", PREFIX + [51], max_tokens=2))  # shares a's prefix: waits
    h.add(gen("c", [90, 91, 92, 93, 94], max_tokens=2))  # unrelated
    h.add(gen("d", PREFIX + [52], salt="d", max_tokens=2))  # same tokens under another salt: unrelated too
    h.add(gen("e", PREFIX + [53], max_tokens=2))  # waits as well, and stays behind b
    first, _ = h.step()
    assert list(first.step_input.num_scheduled_tokens) == ["a", "c", "d"]
    assert req_ids(h.scheduler.waiting) == ["b", "e"]
    assert h.scheduler.snapshot_stats().num_prefix_deferrals == 2
    h.kv.check_integrity()
    second, _ = h.step()
    assert [(r.req_id, r.num_computed_tokens) for r in second.step_input.new_requests] == [("b", 24), ("e", 24)]
    assert run_checked(h) == 25 + 5 + 25 + 1 + 1
    assert all(stream.finish_reason is FinishReason.LENGTH for stream in h.streams.values())


def test_a_prompt_whose_usable_blocks_are_all_cached_is_not_deferred():
    # the last block of an identical prompt is never a hit (one token must be computed), so nothing to wait for
    h = Harness(make_config(max_num_batched_tokens=512), describe(num_blocks=64, block_size=4))
    h.add(gen("a", PREFIX, max_tokens=2))
    h.add(gen("b", PREFIX, max_tokens=2))
    h.step()
    scheduled, _ = h.step()
    (new,) = scheduled.step_input.new_requests
    assert (new.req_id, new.num_computed_tokens) == ("b", 20)
    assert h.scheduler.snapshot_stats().num_prefix_deferrals == 1
    run_checked(h)


# --- the producer goes away: the waiter never waits for nothing ------------------------------------------

def test_producer_aborted_mid_prefill_lets_the_waiter_in_at_the_next_step():
    h = Harness(make_config(max_num_batched_tokens=8), describe(num_blocks=64, block_size=4))
    burst(h, 2)
    h.step()  # r0 computed blocks 0-1 of 6
    assert req_ids(h.scheduler.waiting) == ["r1"]
    assert h.abort("r0") is True
    assert len(h.kv.in_flight) == 0
    h.kv.check_integrity()
    scheduled, _ = h.step()
    (new,) = scheduled.step_input.new_requests
    assert (new.req_id, new.num_computed_tokens) == ("r1", 8)  # r0's computed blocks stay cached after the abort
    assert scheduled.step_input.num_scheduled_tokens == {"r1": 8}
    run_checked(h)
    assert h.streams["r1"].finish_reason is FinishReason.LENGTH


def test_producer_aborted_while_its_step_is_in_flight():
    h = Harness(make_config(max_num_batched_tokens=8), describe(num_blocks=64, block_size=4))
    burst(h, 2)
    scheduled = h.schedule()
    assert h.abort("r0") is True
    h.finish_step(scheduled)  # the output of the aborted r0 is dropped: nothing of it gets cached
    h.kv.check_integrity()
    second, _ = h.step()
    assert [(r.req_id, r.num_computed_tokens) for r in second.step_input.new_requests] == [("r1", 0)]
    assert run_checked(h) == 8 + 27


def test_producer_preempted_mid_prefill_stops_holding_the_waiter():
    # 7 blocks of 4: x decodes and grows; a prefills 21 tokens 8 at a time; b waits for a's prefix
    h = Harness(make_config(max_num_batched_tokens=9), describe(num_blocks=7, block_size=4, max_model_len=64))
    h.add(gen("x", [90, 91, 92, 93], max_tokens=20))
    h.step()
    h.add(gen("a", PREFIX[:20] + [50], max_tokens=2))
    h.add(gen("b", PREFIX[:20] + [51], max_tokens=2))
    preempted = []
    for _ in range(10):
        scheduled, _ = h.step()
        h.kv.check_integrity()
        if "a" in scheduled.preempted_req_ids:
            preempted = scheduled.preempted_req_ids
            break
        assert "b" not in scheduled.step_input.num_scheduled_tokens
    assert preempted == ["a"]  # at its 3rd chunk a needs 2 blocks with 1 free: a is the newest, it goes
    assert len(h.kv.in_flight) == 0  # a's blocks are no longer in flight: b can be admitted once there is room
    assert req_ids(h.scheduler.waiting)[:2] == ["a", "b"]
    run_checked(h)
    assert all(stream.finish_reason is FinishReason.LENGTH for stream in h.streams.values())


# --- the in-flight keys themselves ------------------------------------------------------------------------

def test_in_flight_keys_count_producers_and_drop_as_blocks_are_computed():
    keys = InFlightKeys()
    a, b = [b"k0", b"k1", b"k2"], [b"k0", b"k1", b"z2"]
    keys.add("a", a, 0)
    keys.add("b", b, 1)
    assert (b"k0" in keys, b"k1" in keys, len(keys)) == (True, True, 4)
    keys.advance("a", 2)
    assert (b"k0" in keys, b"k1" in keys) == (False, True)  # b still computes k1
    keys.advance("a", 1)  # going back is a no-op
    keys.discard("b")
    assert (b"k1" in keys, b"z2" in keys, keys.req_ids) == (False, False, {"a"})
    keys.advance("a", 5)  # past the end: everything computed
    assert (len(keys), keys.req_ids) == (0, set())
    keys.add("c", a, 3)  # nothing left to compute: not registered
    keys.check()
    assert keys.req_ids == set()


def test_free_and_caching_drop_in_flight_keys_in_the_kv_manager():
    kv = KVCacheManager(16, 4, enable_prefix_caching=True, watermark=0.0)
    a, b = make_request("a", PREFIX[:12] + [50]), make_request("b", PREFIX[:12] + [51])
    prefix = kv.find_prefix(a)
    kv.allocate_slots(a, a.num_tokens, prefix)
    kv.mark_in_flight(a, prefix)
    assert kv.prefix_in_flight(b, kv.find_prefix(b))
    a.num_computed_tokens = 8
    kv.cache_full_blocks(a)
    hit = kv.find_prefix(b)
    assert (len(hit.blocks), kv.prefix_in_flight(b, hit)) == (2, True)
    kv.check_integrity()
    kv.free(a)
    assert (len(kv.in_flight), kv.prefix_in_flight(b, kv.find_prefix(b))) == (0, False)
    kv.check_integrity()


def test_integrity_catches_in_flight_keys_of_an_unknown_request():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True, watermark=0.0)
    kv.in_flight.add("ghost", [b"k0"], 0)
    with pytest.raises(AssertionError, match="in flight"):
        kv.check_integrity()
