"""KVCacheManager: per-request block tables, slots for exactly the scheduled tokens, the watermark, freeing."""

from __future__ import annotations

import pytest

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from tests.unit.scheduler.scheduler_harness import admit, compute, make_request

BS = 4


def make_kv(num_blocks: int = 8, watermark: float = 0.0, caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_prefix_caching=caching, watermark=watermark)


def test_blocks_needed_rounds_up():
    kv = make_kv()
    assert [kv.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_prefill_gets_exactly_the_blocks_its_tokens_need():
    kv = make_kv()
    r = make_request("r", list(range(1, 11)))
    assert admit(kv, r) == [0, 1, 2]
    assert kv.block_ids("r") == [0, 1, 2]
    assert list(kv.pool.free_queue) == [3, 4, 5, 6, 7]
    assert kv.usage == 3 / 8
    kv.check_integrity()


def test_decodes_take_a_block_only_when_crossing_a_block_boundary():
    kv = make_kv()
    r = make_request("r", list(range(1, 11)))
    admit(kv, r)
    compute(kv, r, 10)
    appended = []
    for token in (11, 12, 13):  # the sampled token is appended, then its KV is computed the next step
        r.token_ids.append(token)
        appended.append(kv.allocate_slots(r, 1))
        compute(kv, r, 1)
    assert appended == [[], [], [3]]  # tokens 11, 12 fit block 2; token 13 is position 12, block 3
    assert kv.block_ids("r") == [0, 1, 2, 3]
    kv.check_integrity()


def test_chunks_allocate_incrementally():
    kv = make_kv()
    r = make_request("r", list(range(1, 12)))
    assert admit(kv, r, num_new=5) == [0, 1]
    compute(kv, r, 5)
    assert kv.allocate_slots(r, 3) == []
    compute(kv, r, 3)
    assert kv.allocate_slots(r, 3) == [2]
    compute(kv, r, 3)
    assert kv.block_ids("r") == [0, 1, 2]
    kv.check_integrity()


def test_watermark_is_kept_free_by_admissions_only():
    kv = make_kv(num_blocks=10, watermark=0.2)
    assert kv.watermark_blocks == 2
    running = make_request("running", list(range(1, 9)))  # 2 blocks
    admit(kv, running)
    compute(kv, running, 8)
    too_big = make_request("too_big", list(range(1, 26)), salt="x")  # 7 blocks + 2 reserved > 8 free
    assert kv.allocate_slots(too_big, 25, kv.find_prefix(too_big), admission=True) is None
    assert "too_big" not in kv.blocks_of
    fits = make_request("fits", list(range(1, 25)), salt="y")  # 6 blocks + 2 reserved == 8 free
    assert admit(kv, fits) == [2, 3, 4, 5, 6, 7]
    compute(kv, fits, 24)
    assert list(kv.pool.free_queue) == [8, 9]
    # a running request may eat into the watermark
    running.token_ids.append(1)
    assert kv.allocate_slots(running, 1) == [8]
    kv.check_integrity()


def test_watermark_rounds_down_to_whole_blocks():
    assert make_kv(num_blocks=10, watermark=0.15).watermark_blocks == 1
    assert make_kv(num_blocks=10, watermark=0.09).watermark_blocks == 0
    assert make_kv(num_blocks=10, watermark=0.0).watermark_blocks == 0


def test_free_hit_blocks_count_against_the_free_blocks():
    kv = make_kv(num_blocks=4)
    a = make_request("a", list(range(1, 9)))
    admit(kv, a)
    compute(kv, a, 8)
    kv.free(a)
    assert list(kv.pool.free_queue) == [2, 3, 1, 0]
    other = make_request("other", [50, 51, 52, 53])
    admit(kv, other)
    assert list(kv.pool.free_queue) == [3, 1, 0]
    b = make_request("b", list(range(1, 9)) + [60, 61, 62, 63, 64])  # hits 0, 1; needs 2 more: 2 + 2 > 3 free
    hit = kv.find_prefix(b)
    assert [blk.block_id for blk in hit.blocks] == [0, 1]
    assert kv.allocate_slots(b, 5, hit, admission=True) is None
    assert [blk.ref_count for blk in kv.pool.blocks] == [0, 0, 1, 0]
    assert list(kv.pool.free_queue) == [3, 1, 0]
    kv.check_integrity()


def test_failed_allocation_of_a_running_request_keeps_its_blocks():
    kv = make_kv(num_blocks=2)
    r = make_request("r", list(range(1, 9)))
    admit(kv, r)
    compute(kv, r, 8)
    r.token_ids.append(9)
    assert kv.allocate_slots(r, 1) is None
    assert kv.block_ids("r") == [0, 1]
    kv.check_integrity()


def test_free_releases_tail_blocks_first_and_forgets_the_request():
    kv = make_kv(num_blocks=6)
    r = make_request("r", list(range(1, 14)))
    admit(kv, r)
    compute(kv, r, 13)
    assert kv.num_cached_of == {"r": 3}
    kv.free(r)
    assert list(kv.pool.free_queue) == [4, 5, 3, 2, 1, 0]
    assert kv.blocks_of == {}
    assert kv.num_cached_of == {}
    assert kv.usage == 0.0
    kv.free(r)  # freeing twice (or a request that never got blocks) is a no-op
    assert list(kv.pool.free_queue) == [4, 5, 3, 2, 1, 0]
    kv.check_integrity()


def test_shared_prefix_blocks_are_released_once_per_owner():
    kv = make_kv(num_blocks=8)
    a = make_request("a", list(range(1, 10)))
    admit(kv, a)
    compute(kv, a, 9)
    b = make_request("b", list(range(1, 9)) + [40])
    assert admit(kv, b) == [0, 1, 3]
    assert [blk.ref_count for blk in kv.pool.blocks[:4]] == [2, 2, 1, 1]
    kv.free(a)
    assert [blk.ref_count for blk in kv.pool.blocks[:4]] == [1, 1, 0, 1]
    assert list(kv.pool.free_queue) == [4, 5, 6, 7, 2]
    kv.free(b)
    assert list(kv.pool.free_queue) == [4, 5, 6, 7, 2, 3, 1, 0]
    kv.check_integrity()


def test_only_blocks_full_of_computed_tokens_are_cached():
    kv = make_kv()
    r = make_request("r", list(range(1, 11)))
    admit(kv, r, num_new=6)
    compute(kv, r, 6)
    assert [b.key is not None for b in kv.pool.blocks[:2]] == [True, False]
    assert kv.num_cached_of == {"r": 1}
    admit_rest = kv.allocate_slots(r, 4)
    assert admit_rest == [2]
    compute(kv, r, 4)
    assert [b.key is not None for b in kv.pool.blocks[:3]] == [True, True, False]
    assert kv.num_cached_of == {"r": 2}
    kv.check_integrity()


def test_blocks_filled_by_outputs_are_cached_with_their_output_tokens():
    kv = make_kv()
    r = make_request("r", [1, 2, 3, 4, 5, 6])
    admit(kv, r)
    compute(kv, r, 6)
    for token in (7, 8, 9):
        r.token_ids.append(token)
        kv.allocate_slots(r, 1)
        compute(kv, r, 1)
    assert r.num_computed_tokens == 9
    assert kv.num_cached_of == {"r": 2}
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert [blk.block_id for blk in kv.find_prefix(b).blocks] == [0, 1]
    kv.check_integrity()


def test_prefix_caching_off_keys_nothing():
    kv = make_kv(caching=False)
    r = make_request("r", list(range(1, 10)))
    admit(kv, r)
    compute(kv, r, 9)
    assert r.block_hashes == []
    assert len(kv.prefix_index) == 0
    assert kv.num_cached_of == {}
    kv.check_integrity()


# --- the integrity check itself catches each kind of corruption --------------------------------------------

def corrupted_kv() -> KVCacheManager:
    kv = make_kv(num_blocks=4)
    r = make_request("r", list(range(1, 10)))
    admit(kv, r)
    compute(kv, r, 9)
    kv.check_integrity()
    return kv


def test_integrity_catches_a_ref_count_that_does_not_match_the_owners():
    kv = corrupted_kv()
    kv.pool.blocks[0].ref_count = 2
    with pytest.raises(AssertionError, match="block 0 ref count mismatch"):
        kv.check_integrity()


def test_integrity_catches_a_block_owned_twice_by_one_request():
    kv = corrupted_kv()
    kv.blocks_of["r"].append(kv.blocks_of["r"][0])
    with pytest.raises(AssertionError, match="request r owns a block twice"):
        kv.check_integrity()


def test_integrity_catches_a_referenced_block_in_the_free_queue():
    kv = corrupted_kv()
    kv.pool.free_queue[1] = None
    with pytest.raises(AssertionError, match="block 1"):
        kv.check_integrity()


def test_integrity_catches_a_leaked_block():
    kv = corrupted_kv()
    del kv.pool.free_queue[3]
    with pytest.raises(AssertionError):
        kv.check_integrity()


def test_integrity_catches_a_key_that_is_not_indexed():
    kv = corrupted_kv()
    kv.prefix_index._block_of_key.clear()
    with pytest.raises(AssertionError, match="block 0 key not indexed"):
        kv.check_integrity()
