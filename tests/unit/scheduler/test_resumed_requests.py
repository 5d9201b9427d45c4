"""Resumed requests (issue 46) against the fake worker: a request carrying `resumed_output_token_ids` continues like
the unfailed run would have (the fake worker's tokens depend only on the token history and the output index), its
stream never repeats the resumed tokens, and max_tokens, min_tokens and the context limit count them. Also the
drain's hand-off: every unfinished request ends with HANDOFF, its blocks freed, and resumes exactly elsewhere.

Every scenario ends with the KV integrity check.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pagedserve.services.scheduler.request import RequestStatus
from pagedserve.services.scheduler.scheduler import RequestRejected
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

PROMPT = [5, 6, 7, 8, 9, 10, 11]  # 7 tokens: the resumed outputs start mid-block (blocks of 4)


def resumed(request: GenerateRequest, output_token_ids: list[int], req_id: str | None = None) -> GenerateRequest:
    return GenerateRequest(req_id or request.req_id, list(request.prompt_token_ids), request.sampling,
                           arrival_time_s=0.0, resumed_output_token_ids=list(output_token_ids))


def unfailed(request: GenerateRequest, **harness) -> list[int]:
    h = Harness(make_config(), describe(**harness))
    h.add(request)
    h.run()
    return h.streams[request.req_id].token_ids


def finished(h: Harness) -> None:
    assert not h.scheduler.requests and not h.scheduler.finished_req_ids and h.worker.mirrors == {}
    h.kv.check_integrity()
    assert h.kv.usage == 0.0


@pytest.mark.parametrize("num_resumed", [1, 5, 11])
def test_a_resumed_request_streams_the_tail_of_the_unfailed_run(num_resumed):
    request = gen("a", PROMPT, max_tokens=12, temperature=0.8, seed=3)
    reference = unfailed(request)
    assert len(reference) == 12
    h = Harness(make_config(), describe())
    h.add(resumed(request, reference[:num_resumed]))
    first_step = h.schedule()
    new = first_step.step_input.new_requests[0]  # the worker mirrors the resumed ids as outputs
    assert (new.token_ids, new.num_prompt_tokens) == (PROMPT + reference[:num_resumed], len(PROMPT))
    h.finish_step(first_step)
    h.run()
    stream = h.streams["a"]
    assert stream.token_ids == reference[num_resumed:]
    assert stream.finish_reason is FinishReason.LENGTH
    assert [o.num_output_tokens for o in stream.outputs] == list(range(num_resumed + 1, 13))
    assert {o.num_prompt_tokens for o in stream.outputs} == {len(PROMPT)}
    finished(h)


def test_a_resumed_request_hits_the_prefix_cache_past_its_prompt_and_reports_prompt_hits_only():
    request = gen("a", PROMPT, max_tokens=12)
    h = Harness(make_config(), describe())
    h.add(request)
    h.run()
    reference = h.streams["a"].token_ids
    h.add(resumed(request, reference[:9], req_id="a2"))  # prompt + 9 outputs = 16 tokens: 4 full cached blocks
    scheduled, _ = h.step()
    new = scheduled.step_input.new_requests[0]
    assert new.num_computed_tokens == 12  # 3 blocks served from the cache (the 4th holds the last known token)
    h.run()
    assert h.streams["a2"].token_ids == reference[9:]
    assert {o.num_cached_tokens for o in h.streams["a2"].outputs} == {7}  # the whole prompt: prompt tokens, not 12
    finished(h)


def test_max_tokens_counts_the_resumed_tokens():
    request = gen("a", PROMPT, max_tokens=8)
    h = Harness(make_config(), describe())
    h.add(resumed(request, [40, 41, 42, 43, 44]))
    h.run()
    assert len(h.streams["a"].token_ids) == 3 and h.streams["a"].finish_reason is FinishReason.LENGTH
    assert h.streams["a"].outputs[-1].num_output_tokens == 8
    finished(h)


def test_min_tokens_counts_the_resumed_tokens():
    request = gen("a", PROMPT, max_tokens=20, min_tokens=7)
    h = Harness(make_config(), describe(), scripts={"a": [40, 41, 42, 43, 44, 0, 0, 45]})  # 0 is EOS
    h.add(resumed(request, [40, 41, 42, 43, 44]))
    h.run()
    assert h.streams["a"].token_ids == [0, 0]  # the 6th output is held off, the 7th may stop
    assert h.streams["a"].finish_reason is FinishReason.STOP
    finished(h)


def test_the_context_limit_counts_the_resumed_tokens():
    request = gen("a", PROMPT, max_tokens=30)
    h = Harness(make_config(), describe(max_model_len=20))
    h.add(resumed(request, list(range(40, 51))))  # 7 + 11 = 18 tokens: 2 left
    h.run()
    assert len(h.streams["a"].token_ids) == 2 and h.streams["a"].finish_reason is FinishReason.LENGTH
    finished(h)


@pytest.mark.parametrize(("outputs", "max_tokens", "message"), [
    ([40, 41, 42, 43], 4, "resumed_output_token_ids has 4 tokens but max_tokens is 4"),
    ([40, 41, 42, 43, 44], 4, "max_tokens counts the resumed tokens"),
    ([40, 97, 42], 8, r"resumed_output_token_ids: token id 97 is out of the vocabulary \(size 97\)"),
    ([40, -1], 8, "resumed_output_token_ids: token id -1 is out of the vocabulary"),
    (list(range(40, 53)), 30, "the prompt and resumed_output_token_ids have 20 tokens but this model's context "
                              "limit is 20 tokens"),
])
def test_a_continuation_that_cannot_run_is_rejected(outputs, max_tokens, message):
    h = Harness(make_config(), describe(max_model_len=20))
    with pytest.raises(RequestRejected, match=message):
        h.scheduler.add_request(resumed(gen("a", PROMPT, max_tokens=max_tokens), outputs))
    assert not h.scheduler.requests and not h.scheduler.waiting
    h.kv.check_integrity()


def test_a_resumed_request_starts_as_a_preempted_one_and_can_be_preempted_again():
    request = gen("a", PROMPT, max_tokens=16)
    reference = unfailed(request)
    h = Harness(make_config(), describe(num_blocks=7))  # 28 slots: "a" (23 tokens) and "b" cannot both run
    h.add(resumed(request, reference[:4]))
    assert h.scheduler.requests["a"].status is RequestStatus.PREEMPTED
    h.step()
    h.add(replace(gen("b", [1, 2, 3, 4, 12, 13, 14, 15], max_tokens=8), priority=-1))  # more urgent: preempts "a"
    h.run()
    assert h.scheduler.snapshot_stats().num_preemptions >= 1
    assert h.streams["a"].token_ids == reference[4:]
    finished(h)


def test_hand_off_ends_every_request_with_handoff_and_frees_its_blocks():
    requests = [gen(f"r{i}", [i + 1, *PROMPT], max_tokens=12) for i in range(3)]
    h = Harness(make_config(max_num_seqs=2), describe())
    for request in requests:
        h.add(request)
    for _ in range(4):
        h.step()
    in_flight = h.schedule()  # a step out when the drain hands off: its tokens are dropped
    assert [r.req_id for r in h.scheduler.waiting] == ["r2"] and h.kv.usage > 0
    outputs = h.scheduler.hand_off_all()
    assert {o.req_id: (o.finish_reason, o.new_token_ids) for o in outputs} == {
        r.req_id: (FinishReason.HANDOFF, []) for r in requests}
    assert [o.num_output_tokens for o in outputs] == [len(h.streams[r.req_id].token_ids) for r in requests]
    assert h.feed(in_flight, h.worker.execute_step(in_flight.step_input)) == []
    assert not h.scheduler.running and not h.scheduler.waiting and h.kv.usage == 0.0
    assert sorted(h.scheduler.finished_req_ids) == ["r0", "r1"]  # the worker is told to drop its mirrors
    assert h.scheduler.snapshot_stats().num_finished == {"handoff": 3}
    h.step()
    finished(h)
    for request in requests:  # resumed elsewhere from what they streamed, they end as the unfailed run
        streamed = h.streams[request.req_id].token_ids
        other = Harness(make_config(), describe())
        other.add(resumed(request, streamed))
        other.run()
        assert streamed + other.streams[request.req_id].token_ids == unfailed(request)
        finished(other)
