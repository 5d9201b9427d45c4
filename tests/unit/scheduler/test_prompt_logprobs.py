"""Prompt logprobs in the scheduler: such a request is never served from the prefix cache (every prompt position's
logits must be computed), its own blocks are still indexed, and the worker's entries go out once, with its first
token."""

from __future__ import annotations

from dataclasses import replace

from pagedserve.shared.step_protocol import TokenLogprobs
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen, make_config

PROMPT = list(range(1, 25)) + [60, 61, 62]  # 6 full blocks of 4, then 3 tokens


def entries(n: int) -> list[TokenLogprobs]:
    return [TokenLogprobs(token_id=t, logprob=-1.0 * t, rank=1, top_token_ids=[t], top_logprobs=[-1.0 * t])
            for t in range(n)]


def test_a_prompt_logprobs_request_reads_no_cached_block_and_others_still_do():
    h = Harness(make_config(), describe(num_blocks=64, block_size=4))
    h.add(gen("warm", PROMPT, max_tokens=1))
    h.run()
    h.add(gen("asks", PROMPT, max_tokens=1, prompt_logprobs=2))
    scheduled, _ = h.step()
    new = scheduled.step_input.new_requests[0]
    assert (new.req_id, new.num_computed_tokens) == ("asks", 0)
    assert scheduled.step_input.num_scheduled_tokens == {"asks": len(PROMPT)}  # the whole prompt, not the tail
    h.run()
    h.add(gen("plain", PROMPT, max_tokens=1))
    scheduled, _ = h.step()
    assert scheduled.step_input.num_scheduled_tokens == {"plain": 3}  # the cache still serves the others
    assert [h.streams[r].outputs[0].num_cached_tokens for r in ("warm", "asks", "plain")] == [0, 0, 24]
    h.kv.check_integrity()


def test_a_prompt_logprobs_request_does_not_wait_for_a_prefix_in_flight():
    """Prefix-aware admission defers a request whose next block another is computing; one that reads no hit has
    nothing to wait for and comes in at once."""
    h = Harness(make_config(max_num_batched_tokens=40), describe(num_blocks=64, block_size=4))
    h.add(gen("first", PROMPT, max_tokens=1))
    h.add(gen("plain", PROMPT, max_tokens=1))
    h.add(gen("asks", PROMPT, max_tokens=1, prompt_logprobs=0))
    scheduled, _ = h.step()
    assert scheduled.step_input.num_scheduled_tokens == {"first": 27, "asks": 13}  # "plain" waits for the hit
    assert h.scheduler.snapshot_stats().num_prefix_deferrals == 1
    h.run()
    assert [h.streams[r].outputs[0].num_cached_tokens for r in ("first", "plain", "asks")] == [0, 24, 0]


def test_the_workers_prompt_logprobs_go_out_once_with_the_first_token():
    h = Harness(make_config(), describe(num_blocks=64, block_size=4))
    h.add(gen("asks", PROMPT, max_tokens=3, prompt_logprobs=1))
    scheduled = h.schedule()
    output = h.worker.execute_step(scheduled.step_input)
    sent = entries(len(PROMPT) - 1)
    first = h.feed(scheduled, replace(output, prompt_logprobs={"asks": sent}))
    assert [o.prompt_logprobs for o in first] == [sent]
    scheduled = h.schedule()
    output = h.worker.execute_step(scheduled.step_input)
    again = h.feed(scheduled, replace(output, prompt_logprobs={"asks": entries(3)}))  # a recomputation's copy
    assert [o.prompt_logprobs for o in again] == [None]
