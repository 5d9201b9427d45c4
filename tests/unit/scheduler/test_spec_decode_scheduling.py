"""The scheduler's side of speculative decoding, with step outputs written by hand: drafts in the budget, slots
reserved then the rejected tail freed, hashes over accepted tokens only, limits and stops exact."""

from __future__ import annotations

import json
from dataclasses import replace

from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.step_protocol import StepOutput
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import gen, make_config

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
                   "disable_by_batch_size": 0})
PROMPT = [5, 6, 7, 8, 9, 10, 11, 5, 6]  # "5 6" recurs: drafts 7 8 9 10


DRAFT_MODEL = json.dumps({"method": "draft_model", "model": "/drafts/tiny", "num_speculative_tokens": 4,
                          "disable_by_batch_size": 0})


def _prefilled(max_tokens: int = 20, stop_token_ids: tuple[int, ...] = (), budget: int = 64, spec: str = SPEC
               ) -> Scheduler:
    """A request whose prompt is computed and whose first output (token 7 sampled by the prompt step) is in."""
    scheduler = Scheduler(make_config(speculative_config=spec, max_num_batched_tokens=budget), describe())
    scheduler.add_request(gen("a", PROMPT, max_tokens=max_tokens, stop_token_ids=stop_token_ids))
    while not scheduler.requests["a"].num_placeholders:  # prompt chunks, which never draft
        chunk = scheduler.schedule()
        assert chunk.step_input.draft_token_ids == {}
        if not scheduler.requests["a"].num_placeholders:
            scheduler.update_from_output(chunk, StepOutput())
    scheduler.update_from_output(chunk, StepOutput(["a"], [7], [None]))
    return scheduler


def test_drafts_take_budget_and_slots_and_the_rejected_tail_is_freed():
    scheduler = _prefilled()
    step = scheduler.schedule()
    assert step.step_input.draft_token_ids == {"a": [8, 9, 10, 11]}
    assert step.step_input.num_scheduled_tokens == {"a": 5}  # the last token plus four drafts
    request = scheduler.requests["a"]
    assert len(scheduler.kv.block_ids("a")) == 4  # 14 tokens of KV reserved in blocks of 4
    assert scheduler.schedule().step_input.is_empty  # not rescheduled while its drafts are in flight
    out = scheduler.update_from_output(step, StepOutput(["a", "a"], [8, 3], [None, None], num_accepted_drafts={"a": 1}))
    assert out[0].new_token_ids == [8, 3]
    assert request.token_ids == PROMPT + [7, 8, 3] and request.num_computed_tokens == 11
    assert len(scheduler.kv.block_ids("a")) == 3  # blocks for 11 tokens: the fourth went back
    assert len(request.block_hashes) == 2  # full blocks of accepted tokens only
    scheduler.kv.check_integrity()
    counters = scheduler.drafts.counters
    assert (counters.num_drafts, counters.num_draft_tokens, counters.num_accepted_per_position) == (1, 4, [1, 0, 0, 0])


def test_drafts_stop_short_of_max_tokens_and_of_the_budget():
    scheduler = _prefilled(max_tokens=3)
    assert scheduler.schedule().step_input.draft_token_ids == {"a": [8]}  # 1 output so far: 2 more at most
    scheduler = _prefilled(budget=3)
    assert scheduler.schedule().step_input.draft_token_ids == {"a": [8, 9]}


def test_a_stop_token_among_accepted_drafts_ends_the_request_there():
    scheduler = _prefilled(stop_token_ids=(9,))
    step = scheduler.schedule()
    out = scheduler.update_from_output(step, StepOutput(["a"] * 5, [8, 9, 10, 11, 4], [None] * 5,
                                                        num_accepted_drafts={"a": 4}))
    assert (out[0].new_token_ids, out[0].finish_reason) == ([8, 9], FinishReason.STOP)
    scheduler.kv.check_integrity()
    assert scheduler.kv.usage == 0.0


def test_off_when_the_batch_reaches_disable_by_batch_size():
    config = json.loads(SPEC) | {"disable_by_batch_size": 2}
    scheduler = Scheduler(make_config(speculative_config=json.dumps(config)), describe())
    for req_id, offset in (("a", 0), ("b", 20)):  # no shared prefix: both run at once
        scheduler.add_request(gen(req_id, [t + offset for t in PROMPT], max_tokens=20))
    first = scheduler.schedule()
    scheduler.update_from_output(first, StepOutput(["a", "b"], [7, 27], [None, None]))
    assert scheduler.schedule().step_input.draft_token_ids == {}


def test_waiting_requests_count_toward_disable_by_batch_size():
    """A burst of arrivals turns speculation off before it is admitted: nothing drafts while it waits."""
    config = json.loads(SPEC) | {"disable_by_batch_size": 2}
    scheduler = _prefilled(spec=json.dumps(config))
    scheduler.add_request(gen("b", [t + 20 for t in PROMPT], max_tokens=20))
    step = scheduler.schedule()
    assert step.step_input.draft_token_ids == {} and set(step.step_input.num_scheduled_tokens) == {"a", "b"}


PLAIN_TEXT = [40, 41, 42, 43, 44, 45]  # no token recurs: never drafts


def _two_decoding(second_prompt: list[int], budget: int = 64) -> Scheduler:
    """Request "a" (copying: its tail recurs) and a second request "b", both prefilled with their first outputs in."""
    scheduler = Scheduler(make_config(speculative_config=SPEC, max_num_batched_tokens=64), describe())
    scheduler.add_request(gen("a", PROMPT, max_tokens=20))
    scheduler.add_request(gen("b", second_prompt, max_tokens=20))
    prompts = scheduler.schedule()
    assert prompts.step_input.num_scheduled_tokens == {"a": len(PROMPT), "b": len(second_prompt)}
    scheduler.update_from_output(prompts, StepOutput(["a", "b"], [7, 99], [None, None]))
    scheduler.config = replace(scheduler.config, max_num_batched_tokens=budget)
    return scheduler


def test_drafts_leave_a_token_for_every_running_request_after_them():
    step = _two_decoding(PLAIN_TEXT, budget=4).schedule().step_input
    assert step.draft_token_ids == {"a": [8, 9]} and step.num_scheduled_tokens == {"a": 3, "b": 1}


def test_the_batch_waits_whole_for_a_step_with_drafts_in_flight():
    """While "a"'s drafts are in flight, "b" (which cannot draft) is not pipelined without it: the next step goes out
    once the drafts' output is back, with both."""
    scheduler = _two_decoding(PLAIN_TEXT)
    step = scheduler.schedule()
    assert step.step_input.draft_token_ids == {"a": [8, 9, 10, 11]}
    assert step.step_input.num_scheduled_tokens == {"a": 5, "b": 1}
    assert scheduler.schedule().step_input.is_empty
    scheduler.update_from_output(step, StepOutput(["a", "a", "b"], [8, 3, 98], [None] * 3,
                                                  num_accepted_drafts={"a": 1}))
    assert set(scheduler.schedule().step_input.num_scheduled_tokens) == {"a", "b"}
    scheduler.kv.check_integrity()


def test_requests_that_cannot_draft_keep_pipelining():
    """With no request copying, async scheduling's overlap stays: the next step is planned while one is in flight."""
    scheduler = _two_decoding([t + 50 for t in PLAIN_TEXT])
    scheduler.abort_request("a")
    first = scheduler.schedule()
    assert first.step_input.num_scheduled_tokens == {"b": 1} and first.step_input.draft_token_ids == {}
    assert scheduler.schedule().step_input.num_scheduled_tokens == {"b": 1}  # pipelined on a placeholder


def test_a_draft_model_gets_positions_not_tokens_and_settles_the_same_way():
    """With a draft model the step carries a count (the worker proposes); budget, slots, the wait for the output
    and the rollback of the rejected tail are the n-gram path's."""
    scheduler = _prefilled(spec=DRAFT_MODEL)
    step = scheduler.schedule()
    assert (step.step_input.draft_token_ids, step.step_input.draft_model_slots) == ({}, {"a": 4})
    assert step.step_input.num_scheduled_tokens == {"a": 5}
    assert len(scheduler.kv.block_ids("a")) == 4
    assert scheduler.schedule().step_input.is_empty  # waits for its drafts' output
    out = scheduler.update_from_output(step, StepOutput(["a"] * 3, [30, 31, 32], [None] * 3,
                                                        num_accepted_drafts={"a": 2}))
    assert out[0].new_token_ids == [30, 31, 32]
    request = scheduler.requests["a"]
    assert request.num_computed_tokens == 12 and len(scheduler.kv.block_ids("a")) == 3
    scheduler.kv.check_integrity()
    assert scheduler.drafts.counters.num_accepted_per_position == [1, 1, 0, 0]
    assert scheduler.schedule().step_input.draft_model_slots == {"a": 4}  # drafts again from the new last token


def test_a_draft_model_request_waits_for_its_plain_step_and_stops_short_of_limits():
    """A request whose plain step is in flight sits the next step out (a draft model can always propose once its
    last token is known); slots stop short of max_tokens and of the budget."""
    scheduler = Scheduler(make_config(speculative_config=DRAFT_MODEL), describe())
    scheduler.add_request(gen("a", PROMPT, max_tokens=20))
    prompt_step = scheduler.schedule()
    assert scheduler.requests["a"].num_placeholders == 1
    assert scheduler.schedule().step_input.is_empty  # held back, not pipelined
    scheduler.update_from_output(prompt_step, StepOutput(["a"], [7], [None]))
    assert scheduler.schedule().step_input.draft_model_slots == {"a": 4}
    assert _prefilled(max_tokens=3, spec=DRAFT_MODEL).schedule().step_input.draft_model_slots == {"a": 1}
    assert _prefilled(budget=3, spec=DRAFT_MODEL).schedule().step_input.draft_model_slots == {"a": 2}
    assert _prefilled(max_tokens=2, spec=DRAFT_MODEL).schedule().step_input.draft_model_slots == {}
