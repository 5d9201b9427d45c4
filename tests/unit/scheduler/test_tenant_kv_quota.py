"""Per-tenant KV-block quotas: each tenant's held + cached blocks are counted as blocks move, an over-quota tenant's
cached blocks are evicted before anyone else's (down to its quota, no further), its requests are preempted first,
the counts reach the stats, and the integrity check holds (and catches a wrong count) under random workloads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedserve.services.scheduler.invariants import InvariantViolated
from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.scheduler import RequestRejected, SchedulerOutput
from pagedserve.shared.request_io import GenerateRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, admit, compute, gen, make_config, make_request, req_ids
from tests.unit.scheduler.test_scheduler_properties import PRESSURE, Before, Run, Scenario, scenarios

BS = 4


def tenant_request(req_id: str, prompt: list[int], tenant: str, share: float | None = None) -> Request:
    request = make_request(req_id, prompt)
    request.tenant, request.kv_cache_share = tenant, share
    return request


def run_and_free(kv: KVCacheManager, request: Request) -> list[int]:
    """Prefill the whole prompt (its full blocks get cached), then finish: the blocks stay cached, unreferenced."""
    block_ids = admit(kv, request)
    compute(kv, request, request.num_tokens - request.num_computed_tokens)
    kv.free(request)
    return block_ids


def num_hit_blocks(kv: KVCacheManager, prompt: list[int]) -> int:
    return len(kv.find_prefix(make_request("probe", prompt + [99])).blocks)


B_PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # two full blocks
A_PROMPT = list(range(20, 36))  # four full blocks


@pytest.mark.parametrize("a_share", [None, 0.25])
def test_an_over_quota_tenants_cached_blocks_are_evicted_first_down_to_its_quota(a_share):
    """B caches 2 blocks, then A caches 4 (freed later, so LRU would keep A's and evict B's). With A's quota of 2
    blocks (a quarter of 8), C's 4 new blocks take A's 2 most recently computed cached blocks (its prompt's tail:
    A's first 2 stay a usable prefix) and then the free queue's head, so B's cache survives."""
    kv = KVCacheManager(8, BS, enable_prefix_caching=True, watermark=0.0)
    assert run_and_free(kv, tenant_request("b", B_PROMPT, "B")) == [0, 1]
    assert run_and_free(kv, tenant_request("a", A_PROMPT, "A", a_share)) == [2, 3, 4, 5]
    assert kv.blocks_by_tenant() == {"A": 4, "B": 2}  # cached blocks count for their tenant
    assert kv.over_quota("A") is (a_share is not None)
    assert list(kv.pool.free_queue) == [6, 7, 1, 0, 5, 4, 3, 2]
    kv.check_integrity()

    c_blocks = admit(kv, tenant_request("c", list(range(50, 63)), "C"))
    if a_share is None:  # plain LRU: B's blocks were freed first, so they go first
        assert c_blocks == [6, 7, 1, 0]
        assert (num_hit_blocks(kv, B_PROMPT), num_hit_blocks(kv, A_PROMPT)) == (0, 4)
        assert kv.blocks_by_tenant() == {"A": 4, "C": 4}
    else:
        assert c_blocks == [5, 4, 6, 7]
        assert (num_hit_blocks(kv, B_PROMPT), num_hit_blocks(kv, A_PROMPT)) == (2, 2)
        assert kv.blocks_by_tenant() == {"A": 2, "B": 2, "C": 4}
        assert not kv.over_quota("A")  # at its quota, no longer over it
    kv.check_integrity()


def test_blocks_count_for_the_tenant_that_allocated_them_while_held_or_cached():
    kv = KVCacheManager(8, BS, enable_prefix_caching=True, watermark=0.0)
    a = tenant_request("a", B_PROMPT + [9], "A")
    admit(kv, a)
    assert kv.blocks_by_tenant() == {"A": 3}  # held: two full blocks and the partial one
    compute(kv, a, 9)
    kv.free(a)
    assert kv.blocks_by_tenant() == {"A": 2}  # the partial block had no key: free, nobody's
    b = tenant_request("b", B_PROMPT + [10], "B")
    assert admit(kv, b) == [0, 1, 3]  # a hit on A's two blocks, plus one new block
    assert kv.blocks_by_tenant() == {"A": 2, "B": 1}  # a hit does not move a block to the tenant that hit it
    kv.check_integrity()
    kv.free(b)
    assert kv.blocks_by_tenant() == {"A": 2}
    kv.check_integrity()


def test_a_quota_is_a_share_of_the_pool_of_at_least_one_block():
    kv = KVCacheManager(10, BS, enable_prefix_caching=True, watermark=0.0)
    assert [kv.quota_blocks(s) for s in (None, 0.01, 0.25, 1.0)] == [None, 1, 2, 10]


def test_the_integrity_check_catches_a_wrong_tenant_count():
    kv = KVCacheManager(8, BS, enable_prefix_caching=True, watermark=0.0)
    run_and_free(kv, tenant_request("a", A_PROMPT, "A", 0.25))
    kv.check_integrity()
    kv.pool.tenants.count["A"] += 1
    with pytest.raises(InvariantViolated, match="tenant block counts"):
        kv.check_integrity()
    kv.pool.tenants.count["A"] -= 1
    kv.pool.tenants.over.discard("A")
    with pytest.raises(InvariantViolated, match="over-quota tenants"):
        kv.check_integrity()


def of(generate: GenerateRequest, tenant: str, share: float | None = None) -> GenerateRequest:
    return replace(generate, tenant=tenant, tenant_kv_cache_share=share)


@pytest.mark.parametrize("hog_share", [None, 0.25])
def test_kv_preemption_takes_an_over_quota_tenants_requests_first(hog_share):
    """Four one-block requests fill a 4-block pool and each needs a second block; `light` is the over-served
    tenant. Without quotas light's requests go (fair share); with hog's quota of one block (it holds two) hog's
    newest goes first, whatever the shares, and then light's newest."""
    h = Harness(make_config(max_num_seqs=8), describe(num_blocks=4, block_size=4))
    for i, (req_id, tenant) in enumerate([("h1", "hog"), ("h2", "hog"), ("l1", "light"), ("l2", "light")]):
        h.add(of(gen(req_id, [30 + i, 2, 3, 4], max_tokens=8), tenant, hog_share if tenant == "hog" else None))
    h.step()
    assert req_ids(h.scheduler.running) == ["h1", "l1", "h2", "l2"]  # admitted alternating by fair share
    assert h.scheduler.snapshot_stats().kv_blocks_by_tenant == {"hog": 2, "light": 2}
    assert h.kv.over_quota("hog") is (hog_share is not None)
    h.scheduler.fair_share.charge("light", 100)
    scheduled = h.schedule()
    if hog_share is None:  # h1's need preempts l2 (light, newest); l1's preempts l1 itself (light)
        assert scheduled.preempted_req_ids == ["l2", "l1"]
    else:  # h1's need preempts h2 (hog, over its quota); l1's then preempts l2 (h1 is already scheduled)
        assert scheduled.preempted_req_ids == ["h2", "l2"]
    h.kv.check_integrity()


def test_a_share_outside_0_to_1_is_rejected():
    h = Harness(make_config(), describe())
    for share in (0.0, -0.5, 1.5):
        with pytest.raises(RequestRejected, match="KV cache share"):
            h.add(of(gen(f"r{share}", [1, 2]), "t", share))
    h.add(of(gen("ok", [1, 2]), "t", 1.0))


TENANTS = (("t0", None), ("t1", 0.25), ("t2", 0.1))


class TenantRun(Run):
    """A random workload whose requests belong to tenants with quotas: preemption no longer goes newest first
    (quotas come first), so only its bookkeeping is checked; every other check of Run holds as it is."""

    def check_preemptions(self, scheduled: SchedulerOutput, before: Before) -> None:
        victims = scheduled.preempted_req_ids
        self.num_preemptions += len(victims)
        assert self.s.counters.num_preemptions == self.num_preemptions
        assert set(victims) <= set(before.running)
        assert not set(victims) & {new.req_id for new in scheduled.step_input.new_requests}
        for req_id in victims:
            assert self.s.requests[req_id].status is RequestStatus.PREEMPTED


def with_tenants(scenario: Scenario, picks: list[int]) -> Scenario:
    arrivals = [replace(a, request=of(a.request, *TENANTS[pick % len(TENANTS)]))
                for a, pick in zip(scenario.arrivals, picks, strict=False)]
    return replace(scenario, arrivals=arrivals)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(scenarios(caching=True), PRESSURE), st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_random_workloads_of_tenants_with_quotas_keep_every_invariant(scenario, picks):
    run = TenantRun(with_tenants(scenario, picks))
    run.go()
    run.check_end()
    cached = {b.owner for b in run.s.kv.pool.blocks if b.key is not None}
    assert set(run.s.kv.blocks_by_tenant()) == cached  # at the end only cached blocks count
