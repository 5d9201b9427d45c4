"""Fair share and priority, exactly: the decayed, weighted service per tenant, the waiting queue's order, the order a
one-slot scheduler admits two tenants' requests in, and whom preemption picks."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pagedserve.services.scheduler.fair_share import FairShare
from pagedserve.services.scheduler.request import Request
from pagedserve.services.scheduler.waiting_queue import WaitingQueue
from pagedserve.shared.request_io import GenerateRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config, make_request, req_ids


def of(generate: GenerateRequest, tenant: str, priority: int = 0) -> GenerateRequest:
    return replace(generate, tenant=tenant, priority=priority)


def request(req_id: str, tenant: str = "", priority: int = 0) -> Request:
    made = make_request(req_id, [1, 2, 3])
    made.tenant, made.priority = tenant, priority
    return made


def test_service_decays_per_step_and_counts_over_the_weight():
    share = FairShare(decay=0.5)
    share.charge("a", 100)
    share.charge("b", 100, weight=4.0)
    assert (share.share("a"), share.share("b"), share.share("nobody")) == (100.0, 25.0, 0.0)
    share.advance()
    share.advance()
    share.charge("a", 10)
    assert share.share("a") == pytest.approx(100 * 0.25 + 10)
    assert share.share("b") == pytest.approx(100 * 0.25 / 4)


def test_tenants_idle_long_enough_are_forgotten():
    share = FairShare(decay=0.5)
    share.charge("old", 1)
    for _ in range(255):
        share.advance()
    share.charge("recent", 1)
    share.advance()  # step 256: the table is swept
    assert set(share.tenants) == {"recent"} and share.share("old") == 0.0  # 0.5 ** 256 < FORGET_BELOW < 0.5


def test_the_queue_takes_priority_then_the_least_served_tenant_then_position():
    share = FairShare()
    queue = WaitingQueue(share)
    for made in (request("a1", "a"), request("a2", "a"), request("b1", "b"), request("late", "b", priority=5),
                 request("urgent", "a", priority=-1)):
        queue.append(made)
    assert req_ids(queue) == ["urgent", "a1", "a2", "b1", "late"]  # iteration: priority, then position
    taken = []
    share.charge("b", 1)  # b was served a little: a goes first within priority 0
    while queue:
        head = queue.peek()
        queue.remove(head)
        taken.append(head.req_id)
        share.charge(head.tenant, 10)
    # urgent: a is charged 10 > b's 1 -> b1; b 11 > a 10 -> a1; then only a at priority 0 -> a2; late last
    assert taken == ["urgent", "b1", "a1", "a2", "late"]


def test_a_request_put_back_goes_first_of_its_priority_and_tenant():
    queue = WaitingQueue(FairShare())
    first, second, back = request("first"), request("second"), request("back")
    queue.append(first)
    queue.append(second)
    queue.appendleft(back)
    assert req_ids(queue) == ["back", "first", "second"] and queue.peek() is back
    queue.remove(first)
    assert first not in queue and second in queue and len(queue) == 2


def test_what_is_ahead_of_a_new_request_follows_the_queue_order():
    share = FairShare()
    queue = WaitingQueue(share)
    for made in (request("a1", "a"), request("b1", "b"), request("c1", "c"), request("u", "c", priority=-1),
                 request("low", "b", priority=3)):
        queue.append(made)
    share.charge("a", 50)
    share.charge("b", 10)
    assert sorted(req_ids(queue.ahead_of(0, "b"))) == ["b1", "c1", "u"]  # c served less, its own b1, urgent u
    assert sorted(req_ids(queue.ahead_of(0, "new"))) == ["c1", "u"]  # c: no service either, and queued first
    assert sorted(req_ids(queue.ahead_of(-1, "a"))) == ["u"]
    assert sorted(req_ids(queue.ahead_of(3, "z"))) == ["a1", "b1", "c1", "u"]  # low: its tenant b was served


def test_a_one_slot_scheduler_alternates_two_tenants_whatever_their_arrival_order():
    h = Harness(make_config(max_num_seqs=1), describe(num_blocks=256))
    for i in range(4):
        h.add(of(gen(f"a{i}", [10 + i, 2, 3, 4], max_tokens=2), "a"))  # a floods first
    for i in range(2):
        h.add(of(gen(f"b{i}", [20 + i, 2, 3, 4], max_tokens=2), "b"))
    admitted = []
    while h.scheduler.has_unfinished_requests():
        scheduled, _ = h.step()
        admitted += [r.req_id for r in scheduled.step_input.new_requests]
    # a0 first (both at 0, a0 came first); then b has less service: b0; then a again, as a's service decayed more
    assert admitted == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_one_tenant_and_one_priority_is_first_come_first_served():
    h = Harness(make_config(max_num_seqs=2), describe(num_blocks=256))
    for i in range(6):
        h.add(gen(f"r{i}", [10 + i, 2, 3, 4], max_tokens=3))
    admitted = []
    while h.scheduler.has_unfinished_requests():
        scheduled, _ = h.step()
        admitted += [r.req_id for r in scheduled.step_input.new_requests]
    assert admitted == [f"r{i}" for i in range(6)]


def fill_pool(h: Harness, tenants: dict[str, str], priorities: dict[str, int] | None = None) -> None:
    """Admit one request per entry (a prompt of 4 tokens of its own: one block) and run their first step."""
    for i, (req_id, tenant) in enumerate(tenants.items()):
        h.add(of(gen(req_id, [30 + i, 2, 3, 4], max_tokens=8), tenant, (priorities or {}).get(req_id, 0)))
    h.step()
    assert len(h.scheduler.running) == len(tenants)


def test_kv_preemption_takes_the_least_urgent_then_the_most_served_tenant_then_the_newest():
    h = Harness(make_config(max_num_seqs=8), describe(num_blocks=4, block_size=4))
    fill_pool(h, {"old": "light", "x": "light", "y": "heavy", "z": "light"}, {"old": 2})
    assert req_ids(h.scheduler.running) == ["x", "y", "z", "old"]  # by priority, then admission
    h.scheduler.fair_share.charge("heavy", 100)
    # every request needs its second block now (4 tokens + the sampled one) and the pool is full: x's need
    # preempts old (the least urgent, though the oldest); y's preempts y (heavy, though z is newer), whose block z
    # then takes (newest first would have preempted z, then y)
    scheduled = h.schedule()
    assert scheduled.preempted_req_ids == ["old", "y"]
    assert req_ids(h.scheduler.running) == ["x", "z"] and req_ids(h.scheduler.waiting) == ["y", "old"]


def test_a_more_urgent_arrival_takes_the_slot_of_the_least_urgent_running_request():
    h = Harness(make_config(max_num_seqs=2), describe(num_blocks=64))
    fill_pool(h, {"batch1": "a", "batch2": "b"}, {"batch1": 10, "batch2": 10})
    h.scheduler.fair_share.charge("b", 5)
    h.add(gen("urgent", [7, 7, 7], max_tokens=2))
    scheduled = h.schedule()
    assert scheduled.preempted_req_ids == ["batch2"]  # the over-served tenant's
    assert "urgent" in scheduled.step_input.num_scheduled_tokens
    assert req_ids(h.scheduler.running) == ["urgent", "batch1"]
    h.finish_step(scheduled)
    h.add(of(gen("same", [8, 8, 8], max_tokens=2), "c", 10))
    assert h.schedule().preempted_req_ids == []  # no more urgent than any running one: it waits for a slot
