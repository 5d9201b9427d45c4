"""The queue-wait estimator against a simulated trace (a fake worker, a simulated clock of fixed step times, so
nothing depends on the machine's speed): 64 requests of 100 tokens fill `max_num_seqs` after some short ones
finished. Every refusal's Retry-After stays within 2x of the time the batch really had left before a slot freed
(or the header's floor of 1 s), and a probe the next step would take is never refused, though two steps are in
flight and they alone are over the bound."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.scheduler.admission import AdmissionConfig, AdmissionControl, Overloaded
from pagedserve.services.scheduler.scheduler import SchedulerOutput
from pagedserve.shared.request_io import RequestOutput
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

STEP_S = 0.1  # every simulated step takes this long
IN_FLIGHT_S = 2 * STEP_S  # two steps in flight at each probe (async scheduling): already over the bound
MAX_QUEUE_WAIT_S = 0.15
NUM_SEQS = 64


@dataclass
class Probe:
    step: int  # probed before this step was planned
    joins: bool  # the next step has a slot and budget for it (judged here from the queue, not by admission)
    retry_after_s: int | None  # None: admitted


def prompt(i: int) -> list[int]:
    return [(i * 7 + k) % 90 + 1 for k in range(8)]


def run_step(h: Harness, control: AdmissionControl) -> list[RequestOutput]:
    scheduled: SchedulerOutput = h.schedule()
    outputs = h.finish_step(scheduled)
    num_finished = sum(1 for out in outputs if out.finished)
    control.estimator.record_step(STEP_S, num_finished, scheduled.step_input.total_num_scheduled_tokens)
    return outputs


def probe(h: Harness, control: AdmissionControl, step: int) -> Probe:
    sched = h.scheduler
    joins = len(sched.waiting) + len(sched.running) < NUM_SEQS
    try:
        control.check(sched, gen("probe", prompt(999), max_tokens=100), num_in_flight=2, in_flight_s=IN_FLIGHT_S)
    except Overloaded as exc:
        return Probe(step, joins, exc.retry_after_s)
    return Probe(step, joins, None)


def simulate() -> tuple[list[Probe], int]:
    """The trace: 8 short requests run to their end, then 64 long ones arrive 8 a step and run to theirs, with a
    probe before every step; returns the probes and the step in which the first long request finished."""
    h = Harness(make_config(max_num_seqs=NUM_SEQS), describe(num_blocks=4096, block_size=4, max_model_len=2048))
    control = AdmissionControl(AdmissionConfig(max_queue_wait_s=MAX_QUEUE_WAIT_S))
    for i in range(8):  # short requests finish first: the estimator has seen a finishing rate
        h.add(gen(f"short{i}", prompt(i), max_tokens=4))
    while h.scheduler.has_unfinished_requests():
        run_step(h, control)
    assert control.estimator.finishes_per_step

    probes: list[Probe] = []
    first_finish_step = None
    step = 0
    while h.scheduler.has_unfinished_requests() or step == 0:
        if step < 8:  # the long requests arrive 8 a step
            for i in range(8 * step, 8 * step + 8):
                h.add(gen(f"long{i}", prompt(i), max_tokens=100))
        probes.append(probe(h, control, step))
        outputs = run_step(h, control)
        if first_finish_step is None and any(out.finished for out in outputs):
            first_finish_step = step
        step += 1
    assert first_finish_step is not None and all(s.finish_reason is not None for s in h.streams.values())
    return probes, first_finish_step


def test_a_request_the_next_step_takes_is_never_refused():
    probes, _ = simulate()
    joiners = [p for p in probes if p.joins]
    assert len(joiners) == 7 + 7  # before the 8th cohort of 8 fills the batch, and after each but the last ends
    assert all(p.retry_after_s is None for p in joiners), joiners


def test_a_full_batch_of_long_requests_gets_retry_afters_within_twice_its_real_remaining_time():
    probes, first_finish_step = simulate()
    refused = [p for p in probes if p.retry_after_s is not None and p.step <= first_finish_step]
    assert len(refused) > 90  # the batch is full for ~100 steps: the bound refuses the probes meanwhile
    for p in refused:
        remaining_s = (first_finish_step + 1 - p.step) * STEP_S  # until the batch's first slot is free
        assert p.retry_after_s <= max(1.0, 2 * remaining_s), (p, remaining_s)
