"""Prefix cache: hash-chain keys of full blocks, salt separation, lookups, LRU eviction, counters, off switch."""

from __future__ import annotations

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.block_hashes import ROOT_KEY, block_key, extend_block_keys
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, admit, compute, gen, make_request

BS = 4


def keys_of(tokens: list[int], salt: str | None = None, block_size: int = BS) -> list[bytes]:
    keys: list[bytes] = []
    extend_block_keys(keys, tokens, block_size, salt)
    return keys


def make_kv(num_blocks: int = 8, caching: bool = True, watermark: float = 0.0) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, watermark=watermark)


def run_alone(kv: KVCacheManager, req_id: str, prompt: list[int], salt: str | None = None):
    """Admit, compute the whole prompt, and return the request (still holding its blocks)."""
    request = make_request(req_id, prompt, salt)
    admit(kv, request)
    compute(kv, request, request.num_tokens - request.num_computed_tokens)
    return request


# --- keys --------------------------------------------------------------------------------------------------

def test_keys_form_a_chain_from_the_root():
    tokens = list(range(1, 11))  # two full blocks and a partial one
    keys = keys_of(tokens, salt="s")
    assert keys == [block_key(ROOT_KEY, [1, 2, 3, 4], "s"), block_key(keys[0], [5, 6, 7, 8], None)]


def test_same_prefix_gives_same_keys_and_only_full_blocks_are_keyed():
    a = keys_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = keys_of([1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13])
    assert len(a) == 2
    assert len(b) == 3
    assert a == b[:2]
    assert keys_of([1, 2, 3]) == []


def test_a_different_earlier_block_changes_every_later_key():
    a = keys_of([1, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8])
    b = keys_of([9, 2, 3, 4, 5, 6, 7, 8, 5, 6, 7, 8])
    assert a[0] != b[0]
    assert a[1] != b[1]  # same tokens in block 1, different parent
    assert a[2] != b[2]
    assert a[1] != a[2]  # same tokens, different position in the chain


def test_salt_separates_every_block_of_equal_prompts():
    tokens = list(range(12))
    plain, salted_a, salted_a2, salted_b = keys_of(tokens), keys_of(tokens, "a"), keys_of(tokens, "a"), \
        keys_of(tokens, "b")
    assert salted_a == salted_a2
    for i in range(3):
        assert len({plain[i], salted_a[i], salted_b[i]}) == 3


def test_extending_keys_incrementally_equals_keying_at_once():
    tokens = list(range(20, 37))
    keys: list[bytes] = []
    for end in range(len(tokens) + 1):
        extend_block_keys(keys, tokens[:end], BS, "t")
    assert keys == keys_of(tokens, "t")
    assert len(keys) == 4


def test_prefix_index_maps_a_key_to_one_block_and_counts_evictions():
    index = PrefixIndex()
    assert index.insert(b"k", 3) is True
    assert index.insert(b"k", 5) is False
    assert index.get(b"k") == 3
    assert index.get(b"missing") is None
    index.remove(b"k")
    assert index.get(b"k") is None
    assert len(index) == 0
    assert index.counters.num_evictions == 1


# --- lookups through the manager ---------------------------------------------------------------------------

def test_hit_covers_the_longest_cached_run_of_full_blocks():
    kv = make_kv()
    a = run_alone(kv, "a", list(range(1, 11)))  # blocks 0, 1 full and keyed; block 2 partial
    assert kv.block_ids("a") == [0, 1, 2]
    assert [kv.pool.blocks[i].key for i in range(3)] == [a.block_hashes[0], a.block_hashes[1], None]
    b = make_request("b", list(range(1, 9)) + [50, 51, 52])
    hit = kv.find_prefix(b)
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
    assert hit.num_tokens(BS) == 8
    kv.check_integrity()


def test_a_prompt_of_exactly_full_cached_blocks_still_computes_its_last_block():
    kv = make_kv()
    run_alone(kv, "a", list(range(1, 9)))
    b = make_request("b", list(range(1, 9)))
    assert [blk.block_id for blk in kv.find_prefix(b).blocks] == [0]  # not block 1: its last token is needed
    assert admit(kv, b) == [0, 2]
    assert b.num_computed_tokens == 4
    assert [blk.ref_count for blk in kv.pool.blocks[:3]] == [2, 1, 1]
    kv.check_integrity()


def test_one_token_prompt_never_hits():
    kv = make_kv()
    run_alone(kv, "a", [7, 7, 7, 7, 7])
    assert kv.find_prefix(make_request("b", [7])).blocks == []
    kv.check_integrity()


def test_a_diverging_block_ends_the_hit():
    kv = make_kv()
    run_alone(kv, "a", list(range(1, 13)))
    b = make_request("b", [1, 2, 3, 4, 99, 6, 7, 8, 9, 10, 11, 12, 13])
    assert [blk.block_id for blk in kv.find_prefix(b).blocks] == [0]
    kv.check_integrity()


def test_salted_request_does_not_hit_an_unsalted_or_differently_salted_prefix():
    kv = make_kv(num_blocks=12)
    prompt = list(range(1, 10))
    run_alone(kv, "plain", prompt)
    run_alone(kv, "tenant-a", prompt, salt="a")
    assert kv.find_prefix(make_request("x", prompt, salt="b")).blocks == []
    assert [b.block_id for b in kv.find_prefix(make_request("y", prompt, salt="a")).blocks] == [3, 4]
    assert [b.block_id for b in kv.find_prefix(make_request("z", prompt)).blocks] == [0, 1]
    kv.check_integrity()


def test_freed_blocks_stay_findable_until_reused_and_tail_blocks_are_evicted_first():
    kv = make_kv(num_blocks=5)
    a = run_alone(kv, "a", list(range(1, 14)))  # blocks 0, 1, 2 full; block 3 holds one token
    kv.free(a)
    assert list(kv.pool.free_queue) == [4, 3, 2, 1, 0]
    assert len(kv.prefix_index) == 3
    kv.check_integrity()

    c = make_request("c", [90, 91, 92, 93, 94, 95, 96, 97, 98])  # 3 blocks: takes 4 (never keyed), 3, then 2
    assert admit(kv, c) == [4, 3, 2]
    assert kv.prefix_index.counters.num_evictions == 1
    assert kv.pool.blocks[2].key is None
    assert list(kv.pool.free_queue) == [1, 0]

    b = make_request("b", list(range(1, 14)))
    assert [blk.block_id for blk in kv.find_prefix(b).blocks] == [0, 1]  # block 2 was evicted, 0 and 1 survive
    kv.check_integrity()


def test_a_referenced_cached_block_is_never_evicted():
    kv = make_kv(num_blocks=4)
    run_alone(kv, "a", list(range(1, 10)))  # holds blocks 0, 1 (keyed) and 2
    big = make_request("big", list(range(50, 58)))
    assert kv.allocate_slots(big, 8, kv.find_prefix(big), admission=True) is None  # 2 needed, 1 free
    assert kv.block_ids("big") == []
    assert "big" not in kv.blocks_of
    assert kv.prefix_index.counters.num_evictions == 0
    assert kv.pool.lookup(kv.pool.blocks[0].key) is kv.pool.blocks[0]
    kv.check_integrity()


def test_hit_on_a_free_cached_block_takes_it_off_the_free_queue():
    kv = make_kv(num_blocks=6)
    a = run_alone(kv, "a", list(range(1, 10)))
    kv.free(a)
    assert list(kv.pool.free_queue) == [3, 4, 5, 2, 1, 0]
    b = make_request("b", list(range(1, 9)) + [40])
    assert admit(kv, b) == [0, 1, 3]
    assert list(kv.pool.free_queue) == [4, 5, 2]
    assert [kv.pool.blocks[i].ref_count for i in (0, 1, 3)] == [1, 1, 1]
    kv.check_integrity()


def test_an_equal_prefix_computed_twice_keeps_one_indexed_copy():
    kv = make_kv(num_blocks=8)
    a, b = make_request("a", list(range(1, 10))), make_request("b", list(range(1, 10)))
    admit(kv, a)
    admit(kv, b)  # admitted in the same step: neither is cached yet
    compute(kv, a, 9)
    compute(kv, b, 9)
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.block_ids("b") == [3, 4, 5]
    assert [kv.pool.blocks[i].key is not None for i in range(6)] == [True, True, False, False, False, False]
    assert kv.num_cached_of == {"a": 2, "b": 2}
    kv.free(b)
    kv.free(a)
    assert list(kv.pool.free_queue) == [6, 7, 5, 4, 3, 2, 1, 0]
    kv.check_integrity()


# --- counters and the off switch, through the scheduler ----------------------------------------------------

def test_counters_count_prompt_tokens_hits_and_evictions():
    h = Harness(SchedulerConfig(max_num_batched_tokens=64, watermark=0.0), describe(num_blocks=6, block_size=BS))
    h.add(gen("a", list(range(1, 14)), max_tokens=1))  # 13 tokens: 3 full blocks keyed, block 3 unkeyed
    h.run()
    h.add(gen("b", list(range(1, 11)) + [70, 71], max_tokens=1))  # hits 2 blocks (8 tokens)
    h.run()
    stats = h.scheduler.snapshot_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (25, 8)
    assert stats.prefix_cache_hit_rate == 8 / 25
    assert stats.prefix_cache_evictions == 0  # b's third block was block 4, never keyed
    assert list(h.kv.pool.free_queue) == [5, 3, 2, 4, 1, 0]  # keyed: 0, 1, 2 (a) and 4 (b)
    h.add(gen("c", [60 + i for i in range(17)], max_tokens=1))  # 5 blocks: 5 and 3 unkeyed, then evicts 2, 4, 1
    h.run()
    stats = h.scheduler.snapshot_stats()
    assert stats.prefix_cache_evictions == 3
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (42, 8)
    assert h.kv.block_ids("c") == [] and h.worker.steps[-2].new_requests[0].block_ids == [5, 3, 2, 4, 1]
    assert [b.block_id for b in h.kv.pool.blocks if b.key is not None] == [0, 2, 3, 4, 5]  # a: 0; c: 5, 3, 2, 4
    assert stats.kv_usage == 0.0
    h.kv.check_integrity()


def test_disabled_prefix_cache_keys_nothing_and_never_hits():
    h = Harness(SchedulerConfig(enable_prefix_caching=False, watermark=0.0), describe(num_blocks=8, block_size=BS))
    h.add(gen("a", list(range(1, 10)), max_tokens=2))
    h.run()
    h.add(gen("b", list(range(1, 10)), max_tokens=2))
    scheduled, _ = h.step()
    assert scheduled.step_input.new_requests[0].num_computed_tokens == 0
    assert scheduled.step_input.num_scheduled_tokens == {"b": 9}
    h.run()
    assert len(h.kv.prefix_index) == 0
    assert all(b.key is None for b in h.kv.pool.blocks)
    stats = h.scheduler.snapshot_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.prefix_cache_hit_rate) == (0, 0, 0.0)
    assert h.streams["a"].token_ids == h.streams["b"].token_ids
    h.kv.check_integrity()
