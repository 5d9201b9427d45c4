"""Async scheduling at the scheduler: step N+1 is scheduled before step N's output comes back.

The fake worker runs the steps in the order they were scheduled and feeds its own samples forward, as the real one
does; each test feeds outputs one step late and checks the streams against a serial run and the KV state exactly.
"""

from __future__ import annotations

from pagedserve.services.scheduler.request import RequestStatus
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.step_protocol import CachedRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

EOS = 0


class Pipeline:
    """One step in flight: `advance()` schedules and runs the next step, then feeds the previous one's output."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.in_flight = None

    def send(self):
        scheduled = self.h.schedule()
        ran = (scheduled, self.h.worker.execute_step(scheduled.step_input))
        done, self.in_flight = self.in_flight, ran
        return scheduled, done

    def feed(self, done) -> list:
        return self.h.feed(*done) if done else []

    def advance(self):
        scheduled, done = self.send()
        return scheduled, self.feed(done)

    def run(self, max_steps: int = 100) -> None:
        for _ in range(max_steps):
            s = self.h.scheduler
            if not (s.has_unfinished_requests() or s.finished_req_ids or self.in_flight):
                return
            scheduled = s.schedule()
            step = scheduled.step_input
            ran = None if step.is_empty and not step.finished_req_ids else (
                scheduled, self.h.worker.execute_step(step))
            done, self.in_flight = self.in_flight, ran
            self.feed(done)
        raise AssertionError("not finished")


def serial_stream(prompt: list[int], **sampling) -> list[int]:
    h = Harness(make_config(), describe(num_blocks=64, block_size=4, eos_token_id=EOS))
    h.add(gen("a", prompt, **sampling))
    h.run()
    return h.streams["a"].token_ids


def test_the_next_step_computes_the_token_still_in_flight():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4))
    h.add(gen("a", [1, 2, 3, 4, 5, 6], max_tokens=4))
    p = Pipeline(h)
    first, outputs = p.advance()
    assert first.step_input.num_scheduled_tokens == {"a": 6} and outputs == []
    request = h.scheduler.requests["a"]
    assert (request.num_computed_tokens, request.num_placeholders) == (6, 1)
    second, outputs = p.advance()  # scheduled before the first token came back: the worker knows it
    assert second.step_input.cached_requests == [CachedRequest("a", [], 6)]
    assert second.step_input.num_scheduled_tokens == {"a": 1}
    assert [len(o.new_token_ids) for o in outputs] == [1]
    assert (request.num_tokens, request.num_computed_tokens, request.num_placeholders) == (7, 7, 1)
    third, _ = p.advance()
    assert third.step_input.cached_requests == [CachedRequest("a", [], 7)]
    fourth, _ = p.advance()
    assert fourth.step_input.cached_requests == [CachedRequest("a", [2], 8)]  # position 8 opens block 2
    p.run()
    assert h.streams["a"].token_ids == serial_stream([1, 2, 3, 4, 5, 6], max_tokens=4)
    assert h.streams["a"].finish_reason is FinishReason.LENGTH
    assert h.kv.usage == 0.0 and h.worker.mirrors == {}
    h.kv.check_integrity()


def test_a_request_that_stops_at_step_n_streams_nothing_from_step_n_plus_1():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4, eos_token_id=EOS), scripts={"a": [9, EOS, 8]})
    h.add(gen("a", [1, 2, 3], max_tokens=10))
    p = Pipeline(h)
    p.advance()  # prompt; samples 9
    p.advance()  # decodes 9, samples EOS; the first output (9) comes back
    third, outputs = p.advance()  # decodes EOS (scheduled before it was known); EOS comes back
    assert third.step_input.num_scheduled_tokens == {"a": 1}
    assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([EOS], FinishReason.STOP)]
    assert h.kv.usage == 0.0 and h.scheduler.requests == {}  # blocks free at once
    fourth, outputs = p.advance()  # the third step's token (8) is dropped; the worker drops its mirror
    assert outputs == [] and fourth.step_input.finished_req_ids == ["a"]
    assert h.streams["a"].token_ids == [9, EOS]
    p.run()
    assert h.worker.mirrors == {}
    h.kv.check_integrity()


def test_a_request_at_its_length_limit_is_not_scheduled_again():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4))
    h.add(gen("a", [1, 2, 3], max_tokens=2))
    p = Pipeline(h)
    p.advance()  # prompt: output 1 in flight
    p.advance()  # decode: output 2 in flight, the last one max_tokens allows
    third, outputs = p.advance()  # planned while the second output is out: a's last token is being sampled
    assert third.step_input.is_empty  # nothing to compute: no wasted step
    assert [(o.num_output_tokens, o.finish_reason) for o in outputs] == [(2, FinishReason.LENGTH)]
    p.run()
    assert [s.total_num_scheduled_tokens for s in h.worker.steps] == [3, 1, 0, 0]
    assert h.streams["a"].token_ids == serial_stream([1, 2, 3], max_tokens=2)
    assert h.streams["a"].finish_reason is FinishReason.LENGTH


def test_a_request_preempted_while_its_step_runs_keeps_that_token_and_resumes_with_it():
    """Pool of 4 blocks of 2: a (3 prompt tokens) and b (2) take all four by their first decodes; a's next
    position needs a fifth, preempting b, the newest, whose decode is still in flight. That step's token is b's,
    and b resumes with it."""
    h = Harness(make_config(max_num_batched_tokens=16), describe(num_blocks=4, block_size=2))
    h.add(gen("a", [1, 2, 3], max_tokens=4))
    h.add(gen("b", [4, 5], max_tokens=4))
    p = Pipeline(h)
    preempting = None
    for _ in range(4):
        scheduled, done = p.send()
        if scheduled.preempted_req_ids:
            preempting = scheduled
            break
        p.feed(done)
    assert preempting is not None and preempting.preempted_req_ids == ["b"]
    b = h.scheduler.requests["b"]
    assert b.status is RequestStatus.PREEMPTED and b.num_placeholders == 1
    num_known = b.num_tokens
    p.feed(done)  # the step in flight at the preemption comes back: its token of b is kept
    assert b.num_tokens == num_known + 1 and b.num_placeholders == 0
    p.run()
    resumed = [new for step in h.worker.steps for new in step.new_requests if new.req_id == "b"][-1]
    assert resumed.token_ids[2:] == h.streams["b"].token_ids[:len(resumed.token_ids) - 2]
    assert h.streams["a"].token_ids == serial_stream([1, 2, 3], max_tokens=4)
    assert h.streams["b"].token_ids == serial_stream([4, 5], max_tokens=4)
    assert h.scheduler.snapshot_stats().num_preemptions == 1
    assert h.kv.usage == 0.0 and h.worker.mirrors == {}
    h.kv.check_integrity()


def test_an_abort_between_two_steps_in_flight_drops_both_outputs():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4))
    h.add(gen("a", [1, 2, 3], max_tokens=10))
    p = Pipeline(h)
    p.advance()
    p.advance()
    assert h.streams["a"].token_ids != []
    num_streamed = len(h.streams["a"].token_ids)
    scheduled, done = p.send()  # a third step is sent; the second one's output is not back yet
    assert h.abort("a")
    assert h.kv.usage == 0.0  # its blocks are free at once; the steps in flight wrote only its own slots
    assert p.feed(done) == []
    following, outputs = p.advance()
    assert outputs == [] and following.step_input.finished_req_ids == ["a"]
    assert len(h.streams["a"].token_ids) == num_streamed
    p.run()
    assert h.worker.mirrors == {}
    h.kv.check_integrity()


def test_a_reused_id_does_not_take_the_token_of_the_request_it_replaced():
    h = Harness(make_config(), describe(num_blocks=16, block_size=4), scripts={"a": [7, 7, 7]})
    h.add(gen("a", [1, 2, 3], max_tokens=3))
    p = Pipeline(h)
    p.advance()
    assert h.abort("a")
    h.add(gen("a", [4, 5], max_tokens=1))
    replaced, outputs = p.advance()  # the old a's first token comes back while the new a runs
    assert outputs == []
    assert replaced.step_input.finished_req_ids == ["a"]
    [new] = replaced.step_input.new_requests
    assert (new.req_id, new.token_ids, new.num_computed_tokens) == ("a", [4, 5], 0)
    p.run()
    assert len(h.streams["a"].token_ids) == 1
    assert h.worker.mirrors == {}
    h.kv.check_integrity()
