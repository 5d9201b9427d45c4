"""Admission control: the queue bounds and the predicted queue time refuse arrivals (429) with a Retry-After; an
empty server takes everything. Predictions are checked against hand-computed figures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pagedserve.services.scheduler.admission import (
    MAX_ADMIT_AFTER_S,
    AdmissionConfig,
    AdmissionControl,
    Overloaded,
    QueueWaitEstimator,
)
from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.step_protocol import StepOutput
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import gen, make_config


def scheduler(**config) -> Scheduler:
    return Scheduler(make_config(**config), describe(num_blocks=1024, block_size=4, max_model_len=2048))


def prompt(i: int, length: int) -> list[int]:
    """A prompt of its own for request i (no shared prefix to wait for)."""
    return [(i * 7 + k) % 90 + 1 for k in range(length)]


def fill(sched: Scheduler, num_running: int, num_waiting: int, prompt_len: int = 8, max_tokens: int = 20) -> None:
    for i in range(num_running):
        sched.add_request(gen(f"run{i}", prompt(i, prompt_len), max_tokens=max_tokens))
    sched.update_from_output(sched.schedule(), StepOutput())  # their prompts computed (the budget holds them)
    assert len(sched.running) == num_running
    for i in range(num_waiting):
        sched.add_request(gen(f"wait{i}", prompt(num_running + i, prompt_len), max_tokens=max_tokens))


def test_an_idle_server_takes_everything_and_predicts_no_wait():
    control = AdmissionControl(AdmissionConfig())
    sched = scheduler()
    control.estimator.record_step(0.05, 0)
    control.check(sched, gen("a", [1, 2, 3]))
    assert control.estimator.predict_s(sched) == 0.0 and control.num_refused == 0


def test_steps_in_flight_are_predicted_but_refuse_no_request_that_joins_the_next_step():
    """Half the running step, all of the one queued behind it (async scheduling), and then the request's own. A
    request that the next step takes (a free slot, room in the budget) is admitted whatever the steps in flight: no
    refusal shortens them; one that must also wait for a slot is refused with them counted."""
    sched = scheduler(max_num_seqs=5)
    fill(sched, num_running=4, num_waiting=0)
    estimator = QueueWaitEstimator()
    estimator.record_step(0.1, 0)
    assert estimator.predict_s(sched, num_in_flight=0) == 0.0  # the worker idles: the next step is this request's
    assert estimator.predict_s(sched, num_in_flight=1) == pytest.approx(0.05)
    assert estimator.predict_s(sched, num_in_flight=2) == pytest.approx(0.15)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.1))
    control.estimator = estimator
    control.check(sched, gen("joins", [1, 2]), num_in_flight=2)
    sched.add_request(gen("took the slot", prompt(9, 8), max_tokens=20))
    # no slot left: the first of 4 running requests with 20 outputs left frees one after 20 steps of 0.1 s
    with pytest.raises(Overloaded, match=r"predicted queue time is 2.15s \(at most 0.1s\)"):
        control.check(sched, gen("behind", [1, 2]), num_in_flight=2)
    assert control.num_refused == 1


def test_the_waiting_queue_is_bounded_by_requests_and_by_prompt_tokens():
    sched = scheduler(max_num_seqs=1)
    fill(sched, num_running=1, num_waiting=2)
    with pytest.raises(Overloaded, match="2 requests are waiting") as info:
        AdmissionControl(AdmissionConfig(max_waiting_requests=2)).check(sched, gen("x", [1]))
    assert info.value.retry_after_s == 1  # no step time measured yet
    tokens = AdmissionControl(AdmissionConfig(max_waiting_tokens=20))
    tokens.check(sched, gen("fits", [1] * 4))  # 16 waiting + 4
    with pytest.raises(Overloaded, match="16 prompt tokens are waiting"):
        tokens.check(sched, gen("too many", [1] * 5))


def test_full_slots_predict_a_wait_of_the_finishes_ahead_at_the_measured_rate():
    sched = scheduler(max_num_seqs=4)
    fill(sched, num_running=4, num_waiting=6)
    estimator = QueueWaitEstimator()
    for _ in range(50):
        estimator.record_step(0.1, 2)  # 0.1 s a step, two requests finishing a step
    # 6 waiting + 4 running + the new one - 4 slots = 7 finishes ahead, at 2 a step: 3.5 steps of 0.1 s
    assert estimator.predict_s(sched) == pytest.approx(0.35, rel=1e-6)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.2))
    control.estimator = estimator
    with pytest.raises(Overloaded, match=r"predicted queue time is 0.35s \(at most 0.2s\)") as info:
        control.check(sched, gen("late", [1, 2]))
    assert info.value.retry_after_s == 1 and control.num_refused == 1
    AdmissionControl(AdmissionConfig(max_queue_wait_s=0.5)).check(sched, gen("fine", [1, 2]))


def test_before_any_finish_the_slot_wait_comes_from_the_outputs_left():
    sched = scheduler(max_num_seqs=2)
    fill(sched, num_running=2, num_waiting=0, max_tokens=20)
    estimator = QueueWaitEstimator()
    estimator.record_step(0.5, 0)
    assert estimator.finishes_per_step is None
    assert estimator.predict_s(sched) == pytest.approx(20 * 0.5)  # a slot frees after its 20 outputs


def test_prompt_work_ahead_is_spread_over_the_budget_left_by_decodes():
    sched = scheduler(max_num_batched_tokens=62, max_num_seqs=100)
    fill(sched, num_running=2, num_waiting=10, prompt_len=30)
    estimator = QueueWaitEstimator()
    estimator.record_step(0.2, 0)
    # 10 waiting prompts of 30 tokens over 62 - 2 tokens a step: 5 steps of 0.2 s
    assert estimator.predict_s(sched) == pytest.approx(1.0)


def test_retry_after_is_at_least_one_and_at_most_a_minute():
    sched = scheduler(max_num_seqs=1)
    fill(sched, num_running=1, num_waiting=50, max_tokens=1000)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=1))
    control.estimator.record_step(10.0, 0)
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("x", [1]))
    assert info.value.retry_after_s == 60


def test_a_refusal_says_how_long_arrivals_would_be_refused_too():
    """Nothing admission reads changes before the step in flight ends: a refusal promises at least that long (the
    excess of the predicted wait when longer), capped at MAX_ADMIT_AFTER_S; an unbounded wait does not promise."""
    sched = scheduler(max_num_seqs=4)
    fill(sched, num_running=4, num_waiting=6)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.2))
    for _ in range(50):
        control.estimator.record_step(0.1, 2)  # predicted wait 0.35 s (the test above): an excess of 0.15 s
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("a", [1, 2]), step_ends_in_s=0.04)
    assert info.value.admit_after_s == pytest.approx(0.15)
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("b", [1, 2]), step_ends_in_s=0.3)
    assert info.value.admit_after_s == pytest.approx(0.3)
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("c", [1, 2]), step_ends_in_s=7.0)
    assert info.value.admit_after_s == MAX_ADMIT_AFTER_S


def test_a_full_queue_promises_until_the_step_in_flight_ends():
    sched = scheduler(max_num_seqs=1)
    fill(sched, num_running=1, num_waiting=2)
    control = AdmissionControl(AdmissionConfig(max_waiting_requests=2))
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("x", [1]), step_ends_in_s=0.06)
    assert info.value.admit_after_s == pytest.approx(0.06)
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("y", [1]))  # no step out: the next arrival may find a changed queue
    assert info.value.admit_after_s == 0.0
    tokens = AdmissionControl(AdmissionConfig(max_waiting_tokens=20))  # 16 prompt tokens wait
    with pytest.raises(Overloaded) as info:
        tokens.check(sched, gen("long", [1] * 5), step_ends_in_s=0.06)
    assert info.value.admit_after_s == 0.0  # a prompt of 4 would still fit: nothing to promise of others
    with pytest.raises(Overloaded) as info:
        AdmissionControl(AdmissionConfig(max_waiting_tokens=16)).check(sched, gen("z", [1]), step_ends_in_s=0.06)
    assert info.value.admit_after_s == pytest.approx(0.06)


def test_the_predicted_wait_counts_only_work_of_the_same_or_a_more_urgent_priority():
    """Four running and six waiting at priority 10 (max_num_seqs 4): a priority-10 arrival waits for 7 finishes, a
    priority-0 one for nothing (a running priority-10 request gives its slot up): admitted though two steps are in
    flight and they are over the bound."""
    sched = scheduler(max_num_seqs=4)
    for i in range(4):
        sched.add_request(replace(gen(f"run{i}", prompt(i, 8), max_tokens=20), priority=10))
    sched.update_from_output(sched.schedule(), StepOutput())
    for i in range(6):
        sched.add_request(replace(gen(f"wait{i}", prompt(4 + i, 8), max_tokens=20), priority=10))
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.2))
    for _ in range(50):
        control.estimator.record_step(0.1, 2)
    assert control.estimator.predict_s(sched, priority=10) == pytest.approx(0.35, rel=1e-6)  # as at one priority
    assert control.estimator.predict_s(sched, priority=0) == 0.0
    with pytest.raises(Overloaded):
        control.check(sched, replace(gen("batch", [1, 2]), priority=10), num_in_flight=2)
    control.check(sched, replace(gen("urgent", [1, 2]), priority=0), num_in_flight=2)
    assert control.estimator.joins_next_step(sched, priority=0)
    assert not control.estimator.joins_next_step(sched, priority=10)


def test_a_quiet_tenant_is_not_queued_behind_a_flooding_one():
    """Tenant a's six waiting requests are not ahead of tenant b's arrival while a was served more: b waits only
    for a slot (one finish at 2 a step: half a step)."""
    sched = scheduler(max_num_seqs=4)
    for i in range(4):
        sched.add_request(replace(gen(f"run{i}", prompt(i, 8), max_tokens=20), tenant="a"))
    sched.update_from_output(sched.schedule(), StepOutput())  # a is charged its 32 prompt tokens
    for i in range(6):
        sched.add_request(replace(gen(f"wait{i}", prompt(4 + i, 8), max_tokens=20), tenant="a"))
    estimator = QueueWaitEstimator()
    for _ in range(50):
        estimator.record_step(0.1, 2)
    assert estimator.predict_s(sched, tenant="a") == pytest.approx(0.35, rel=1e-6)
    assert estimator.predict_s(sched, tenant="b") == pytest.approx(0.05, rel=1e-6)


def test_a_burst_the_next_step_takes_whole_is_admitted_whatever_the_steps_in_flight():
    """Requests arriving together during a long step: each one that still fits the next step's slots and budget
    joins it (not only the first); the one past the slots is judged by its predicted wait."""
    sched = scheduler(max_num_seqs=3, max_num_batched_tokens=64)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.1))
    control.estimator.record_step(1.0, 0)  # a slow machine: the steps in flight alone are 1.5 s
    for i in range(3):
        request = gen(f"burst{i}", prompt(i, 8), max_tokens=20)
        control.check(sched, request, num_in_flight=2)
        sched.add_request(request)
    with pytest.raises(Overloaded):
        control.check(sched, gen("fourth", prompt(3, 8)), num_in_flight=2)
    long_prompts = scheduler(max_num_seqs=8, max_num_batched_tokens=64)
    long_prompts.add_request(gen("long", prompt(0, 64), max_tokens=20))  # takes the whole next step's budget
    with pytest.raises(Overloaded):
        control.check(long_prompts, gen("after", prompt(1, 8)), num_in_flight=2)


def test_a_refusal_promises_nothing_while_a_more_urgent_or_less_served_arrival_could_be_admitted():
    sched = scheduler(max_num_seqs=4)
    fill(sched, num_running=4, num_waiting=6)
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=0.2))
    for _ in range(50):
        control.estimator.record_step(0.1, 2)
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("same class", [1, 2]), step_ends_in_s=0.3)
    assert info.value.admit_after_s == pytest.approx(0.3)  # one priority, one tenant: the promise holds
    sched.add_request(replace(gen("batch", prompt(20, 8)), priority=10))
    with pytest.raises(Overloaded) as info:
        control.check(sched, gen("urgent", [1, 2]), step_ends_in_s=0.3)
    assert info.value.admit_after_s == 0.0
