"""The scheduler's side of speculative decoding, with step outputs written by hand: drafts in the budget, slots
reserved then the rejected tail freed, hashes over accepted tokens only, limits and stops exact."""

from __future__ import annotations

import json

from pagedserve.services.scheduler.scheduler import Scheduler
from pagedserve.shared.request_io import FinishReason
from pagedserve.shared.step_protocol import StepOutput
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import gen, make_config

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2,
                   "disable_by_batch_size": 0})
PROMPT = [5, 6, 7, 8, 9, 10, 11, 5, 6]  # "5 6" recurs: drafts 7 8 9 10


def _prefilled(max_tokens: int = 20, stop_token_ids: tuple[int, ...] = (), budget: int = 64) -> Scheduler:
    """A request whose prompt is computed and whose first output (token 7 sampled by the prompt step) is in."""
    scheduler = Scheduler(make_config(speculative_config=SPEC, max_num_batched_tokens=budget), describe())
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
