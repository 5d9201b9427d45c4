"""Fair share and priority on a saturated scheduler, simulated step by step against the fake worker (no clock):
two tenants of equal weight, A offering ten times B's rate, share the generated tokens about evenly while both are
backlogged, and A takes every token once B stops; a priority-0 request arriving during a priority-10 flood is in
the very next step. Figures are printed (run with -s)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pagedserve.services.scheduler.admission import AdmissionConfig, AdmissionControl, Overloaded
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

NUM_SEQS = 8
MAX_TOKENS = 16


def arrival(h: Harness, tenant: str, n: int, priority: int = 0, weight: float = 1.0) -> str:
    req_id = f"{tenant}{n}"
    h.add(replace(gen(req_id, [(n * 13 + k) % 90 + 1 for k in range(8)], max_tokens=MAX_TOKENS), tenant=tenant,
                  priority=priority, tenant_weight=weight))
    return req_id


def test_two_equal_tenants_share_the_tokens_while_both_wait_and_one_alone_gets_all():
    h = Harness(make_config(max_num_seqs=NUM_SEQS), describe(num_blocks=1024, max_model_len=256))
    tenant_of: dict[str, str] = {}
    tokens_both = {"a": 0, "b": 0}  # generated tokens in steps where both tenants had requests waiting
    tokens_alone = {"a": 0, "b": 0}  # after B's last request ended
    num_a = num_b = steps_both = steps_alone = 0
    for step in range(1000):
        for _ in range(5):  # A: 5 requests a step, ten times B's rate, both far over capacity (~0.5 a step)
            tenant_of[arrival(h, "a", num_a)] = "a"
            num_a += 1
        if step < 300 and step % 2 == 0:
            tenant_of[arrival(h, "b", num_b)] = "b"
            num_b += 1
        waiting_tenants = {r.tenant for r in h.scheduler.waiting}
        b_done = step >= 300 and not any(tenant_of[r] == "b" for r in h.scheduler.requests)
        _, outputs = h.step()
        produced = {"a": 0, "b": 0}
        for out in outputs:
            produced[tenant_of[out.req_id]] += len(out.new_token_ids)
        if step >= 50 and waiting_tenants == {"a", "b"}:
            steps_both += 1
            for tenant in produced:
                tokens_both[tenant] += produced[tenant]
        if b_done:
            steps_alone += 1
            for tenant in produced:
                tokens_alone[tenant] += produced[tenant]
    b_fraction = tokens_both["b"] / (tokens_both["a"] + tokens_both["b"])
    print(f"FIGURE fair share: both backlogged {steps_both} steps, B {b_fraction:.1%} of {sum(tokens_both.values())} "
          f"tokens; B stopped: A {tokens_alone['a']} tokens in {steps_alone} steps")
    assert steps_both >= 300 and b_fraction >= 0.45
    # once B is gone every slot is A's: a token per running request each step (no slot idles, none goes to B)
    assert steps_alone >= 300 and tokens_alone["b"] == 0 and tokens_alone["a"] >= 0.99 * NUM_SEQS * steps_alone


def test_a_priority_0_request_during_a_priority_10_flood_is_admitted_and_scheduled_at_the_next_step():
    h = Harness(make_config(max_num_seqs=NUM_SEQS), describe(num_blocks=1024, max_model_len=256))
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.05))
    for step in range(60):
        for i in range(5):
            arrival(h, "flood", 5 * step + i, priority=10)
        _, outputs = h.step()
        control.estimator.record_step(0.01, sum(1 for out in outputs if out.finished))
    assert len(h.scheduler.running) == NUM_SEQS and len(h.scheduler.waiting) > 200
    urgent = replace(gen("urgent", [5, 6, 7, 8], max_tokens=4), tenant="flood", priority=0)
    control.check(h.scheduler, urgent, num_in_flight=2, in_flight_s=0.03)  # admitted: the next step takes it
    flood = replace(gen("more", [5, 6, 7, 9], max_tokens=4), tenant="flood", priority=10)
    with pytest.raises(Overloaded):  # the flood's own arrivals wait for its queue
        control.check(h.scheduler, flood, num_in_flight=2, in_flight_s=0.03)
    h.add(urgent)
    scheduled, outputs = h.step()
    assert "urgent" in scheduled.step_input.num_scheduled_tokens and len(scheduled.preempted_req_ids) == 1
    assert [len(out.new_token_ids) for out in outputs if out.req_id == "urgent"] == [1]  # its first token


def test_a_tenant_of_twice_the_weight_gets_about_two_thirds():
    h = Harness(make_config(max_num_seqs=NUM_SEQS), describe(num_blocks=1024, max_model_len=256))
    tenant_of: dict[str, str] = {}
    tokens = {"a": 0, "b": 0}
    for step in range(1000):
        for n in range(5 * step, 5 * step + 5):
            tenant_of[arrival(h, "a", n)] = "a"
        tenant_of[arrival(h, "b", step, weight=2.0)] = "b"
        _, outputs = h.step()
        for out in outputs:
            if step >= 50:
                tokens[tenant_of[out.req_id]] += len(out.new_token_ids)
    b_fraction = tokens["b"] / sum(tokens.values())
    print(f"FIGURE fair share, B of weight 2: {b_fraction:.1%} of {sum(tokens.values())} tokens")
    assert 0.6 <= b_fraction <= 0.72  # 2/3 up to the granularity of 8 slots
