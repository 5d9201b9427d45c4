"""BlockPool: a fixed set of blocks, ref counts, a free queue in LRU eviction order, cached-key bookkeeping."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.block_pool import BlockPool
from pagedserve.services.scheduler.prefix_cache import PrefixIndex


def make_pool(num_blocks: int = 6) -> BlockPool:
    return BlockPool(num_blocks, PrefixIndex())


def check_pool(pool: BlockPool, refs: dict[int, int]) -> None:
    """Integrity of a bare pool: exact ref counts; free <=> unreferenced; free + in use == total; keys indexed."""
    assert {b.block_id: b.ref_count for b in pool.blocks if b.ref_count} == refs
    assert set(pool.free_queue) == {b.block_id for b in pool.blocks if b.ref_count == 0}
    assert len(pool.free_queue) + len(refs) == pool.num_blocks
    keyed = {b.key: b.block_id for b in pool.blocks if b.key is not None}
    assert {k: pool.prefix_index.get(k) for k in pool.prefix_index.keys()} == keyed
    pool.check_tenants()  # every held or cached block counted for its tenant


def free_order(pool: BlockPool) -> list[int]:
    return list(pool.free_queue)


def test_new_pool_is_all_free_in_id_order():
    pool = make_pool(6)
    assert pool.num_blocks == 6
    assert pool.num_free_blocks == 6
    assert pool.usage == 0.0
    assert free_order(pool) == [0, 1, 2, 3, 4, 5]
    check_pool(pool, {})


def test_allocate_takes_from_the_head_with_ref_count_one():
    pool = make_pool(6)
    blocks = pool.allocate(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert [b.ref_count for b in blocks] == [1, 1, 1]
    assert free_order(pool) == [3, 4, 5]
    assert pool.num_free_blocks == 3
    assert pool.usage == 0.5
    check_pool(pool, {0: 1, 1: 1, 2: 1})


def test_allocate_zero_is_a_no_op():
    pool = make_pool(3)
    assert pool.allocate(0) == []
    assert free_order(pool) == [0, 1, 2]
    check_pool(pool, {})


def test_allocating_more_than_free_raises_and_changes_nothing():
    pool = make_pool(4)
    pool.allocate(3)
    with pytest.raises(ValueError, match="asked for 2 blocks with 1 free"):
        pool.allocate(2)
    assert free_order(pool) == [3]
    check_pool(pool, {0: 1, 1: 1, 2: 1})


def test_release_appends_to_the_tail_in_the_given_order():
    pool = make_pool(6)
    blocks = pool.allocate(3)
    pool.release(list(reversed(blocks)))  # how a request frees: its last block first
    assert free_order(pool) == [3, 4, 5, 2, 1, 0]
    assert [b.ref_count for b in blocks] == [0, 0, 0]
    check_pool(pool, {})


def test_least_recently_freed_is_reused_first():
    pool = make_pool(4)
    a, b, c, d = pool.allocate(4)
    pool.release([c])
    pool.release([a])
    pool.release([d])
    assert free_order(pool) == [2, 0, 3]
    assert [x.block_id for x in pool.allocate(2)] == [2, 0]
    assert free_order(pool) == [3]
    check_pool(pool, {0: 1, 1: 1, 2: 1})


def test_shared_block_is_freed_only_by_its_last_reference():
    pool = make_pool(4)
    (block,) = pool.allocate(1)
    pool.touch([block])  # a second request hits it
    assert block.ref_count == 2
    pool.release([block])
    assert block.ref_count == 1
    assert 0 not in pool.free_queue
    check_pool(pool, {0: 1})
    pool.release([block])
    assert free_order(pool) == [1, 2, 3, 0]
    check_pool(pool, {})


def test_touch_pulls_a_free_block_out_of_the_free_queue():
    pool = make_pool(4)
    blocks = pool.allocate(2)
    pool.release(blocks)
    assert free_order(pool) == [2, 3, 0, 1]
    pool.touch([pool.blocks[3], pool.blocks[0]])
    assert free_order(pool) == [2, 1]
    assert pool.blocks[3].ref_count == 1
    assert pool.blocks[0].ref_count == 1
    check_pool(pool, {0: 1, 3: 1})


def test_releasing_an_unreferenced_block_is_an_internal_error():
    pool = make_pool(2)
    (block,) = pool.allocate(1)
    pool.release([block])
    with pytest.raises(AssertionError, match="block 0 released more often than referenced"):
        pool.release([block])


def test_cached_block_stays_findable_while_free_until_handed_out():
    pool = make_pool(3)
    blocks = pool.allocate(2)
    pool.cache(blocks[0], b"k0")
    pool.cache(blocks[1], b"k1")
    pool.release(list(reversed(blocks)))
    assert free_order(pool) == [2, 1, 0]
    assert pool.lookup(b"k0") is pool.blocks[0]
    assert pool.lookup(b"k1") is pool.blocks[1]
    check_pool(pool, {})
    # block 2 (never cached) goes first, then block 1: its key is evicted, block 0's survives
    assert [b.block_id for b in pool.allocate(2)] == [2, 1]
    assert pool.lookup(b"k1") is None
    assert pool.blocks[1].key is None
    assert pool.lookup(b"k0") is pool.blocks[0]
    assert pool.prefix_index.counters.num_evictions == 1
    check_pool(pool, {1: 1, 2: 1})


def test_cache_keeps_the_first_block_for_a_key():
    pool = make_pool(3)
    a, b, _ = pool.allocate(3)
    pool.cache(a, b"same")
    pool.cache(b, b"same")  # an equal prefix computed twice: the second copy stays unindexed
    assert pool.lookup(b"same") is a
    assert b.key is None
    pool.cache(a, b"other")  # a block holds at most one key
    assert a.key == b"same"
    assert pool.lookup(b"other") is None
    assert len(pool.prefix_index) == 1
    check_pool(pool, {0: 1, 1: 1, 2: 1})


def test_referenced_cached_block_is_never_evicted():
    pool = make_pool(3)
    held, freed, _ = pool.allocate(3)
    pool.cache(held, b"held")
    pool.cache(freed, b"freed")
    pool.release([freed])
    assert [b.block_id for b in pool.allocate(1)] == [1]
    with pytest.raises(ValueError):
        pool.allocate(1)
    assert pool.lookup(b"held") is held
    assert pool.lookup(b"freed") is None
    assert pool.prefix_index.counters.num_evictions == 1
    check_pool(pool, {0: 1, 1: 1, 2: 1})
