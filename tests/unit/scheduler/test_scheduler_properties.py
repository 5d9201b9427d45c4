"""Property tests: random workloads through the real scheduler and the checking fake worker.

Random arrivals (also while a step is in flight), prompts that share prefixes (with and without salts), output
lengths, stop rules, aborts (between steps and in flight), small pools (so preemptions happen), and random budget,
max_num_seqs, block size, watermark, chunked prefill and prefix caching, serial or async scheduling (the next
step scheduled before the last one's output comes back), and n-gram speculation (drafts verified greedily by the
fake worker, over a small vocabulary so that they are often accepted). Every step is checked against the
scheduler's invariants; at the end everything is finished and free, and every finished request produced exactly
what it produces when it runs alone (serially, without speculation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pagedserve.services.scheduler.request import RequestStatus
from pagedserve.services.scheduler.scheduler import RequestRejected, SchedulerOutput
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.shared.request_io import FinishReason, GenerateRequest
from pagedserve.shared.step_protocol import StepOutput
from tests.support.fake_worker import describe
from tests.unit.scheduler.scheduler_harness import Harness, gen

EOS = 0
STOP_TOKEN = 3  # a stop token id some requests use
SALTS = (None, None, "x", "y")


@dataclass
class Arrival:
    request: GenerateRequest
    step: int
    in_flight: bool  # added while the step is on the worker (between schedule and update_from_output)
    abort_step: int | None
    abort_in_flight: bool


@dataclass
class Scenario:
    config: SchedulerConfig
    num_blocks: int
    block_size: int
    max_model_len: int
    eos_prob: float
    arrivals: list[Arrival]
    async_scheduling: bool = False  # schedule step N+1 before feeding step N's output (one step in flight)
    vocab_size: int = 97

    def description(self, num_blocks: int | None = None):
        return describe(num_blocks=num_blocks or self.num_blocks, block_size=self.block_size,
                        max_model_len=self.max_model_len, vocab_size=self.vocab_size, eos_token_id=EOS)

    @property
    def speculative(self) -> bool:
        return bool(self.config.speculative_config)


def pattern(seed: int, length: int, alphabet: int) -> list[int]:
    """A cheap token run that shrinks by its length (hypothesis draws short lists far more often than long ones)."""
    return [(seed * 7 + i * (seed % 3 + 1)) % alphabet + 1 for i in range(length)]


@st.composite
def scenarios(draw, caching: bool | None = None, min_requests: int = 1, min_stem: int = 0,
              pool_sizes: tuple[int, ...] = (12, 16, 24, 32, 48, 96), speculative: bool = False) -> Scenario:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_blocks = max(2, draw(st.sampled_from(pool_sizes)) // block_size)  # in tokens: small, so requests preempt
    config = SchedulerConfig(
        max_num_batched_tokens=draw(st.sampled_from([1, 2, 3, 5, 8, 13, 16, 24, 40])),
        max_num_seqs=draw(st.sampled_from([1, 2, 3, 4, 6])),
        enable_chunked_prefill=draw(st.booleans()),
        enable_prefix_caching=draw(st.booleans()) if caching is None else caching,
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25])),
        prefill_finish_slack=draw(st.sampled_from([0, 0, None, 2, 7])),
        speculative_config=json.dumps({
            "method": "ngram", "num_speculative_tokens": draw(st.sampled_from([1, 2, 4])), "prompt_lookup_min": 1,
            "prompt_lookup_max": draw(st.sampled_from([1, 2, 3])),
            "disable_by_batch_size": draw(st.sampled_from([0, 0, 2, 3]))}) if speculative else "",
    )
    max_model_len = draw(st.sampled_from([8, 16, 24, 32, 48, 64]))
    # a few shared stems, so that prompts share prefixes and the prefix cache gets hit
    stems = [pattern(seed, draw(st.sampled_from(range(min_stem, 25))), 4) for seed in range(draw(st.integers(1, 3)))]
    arrivals = []
    for i in range(draw(st.sampled_from(range(min_requests, 9)))):
        prompt = draw(st.sampled_from(stems)) + pattern(draw(st.integers(0, 50)), draw(st.sampled_from(range(11))), 6)
        max_tokens = draw(st.sampled_from(range(1, 13)))
        if draw(st.integers(0, 7)):  # mostly requests that fit the context and the pool; some are rejected
            prompt = prompt[:min(max_model_len - 1, num_blocks * block_size - max_tokens)]
        prompt = prompt or [5]
        sampling = dict(max_tokens=max_tokens, min_tokens=draw(st.integers(0, min(max_tokens, 3))),
                        ignore_eos=draw(st.booleans()),
                        stop_token_ids=draw(st.sampled_from([(), (), (STOP_TOKEN,)])))
        request = gen(f"r{i}", prompt, draw(st.sampled_from(SALTS)), **sampling)
        aborts = draw(st.integers(0, 3)) == 0
        arrivals.append(Arrival(request, draw(st.sampled_from(range(13))), draw(st.booleans()),
                                draw(st.integers(0, 16)) if aborts else None, draw(st.booleans())))
    return Scenario(config, num_blocks, block_size, max_model_len, draw(st.sampled_from([0.0, 0.1, 0.3])),
                    arrivals, draw(st.booleans()), vocab_size=draw(st.sampled_from([7, 8, 12])) if speculative else 97)


def expect_rejected(scenario: Scenario, request: GenerateRequest) -> bool:
    num_prompt = len(request.prompt_token_ids)
    max_tokens = min(num_prompt + request.sampling.max_tokens, scenario.max_model_len)
    return num_prompt >= scenario.max_model_len or -(-max_tokens // scenario.block_size) > scenario.num_blocks


class Before:
    """What the checks need from the scheduler's state right before `schedule()`."""

    def __init__(self, scheduler) -> None:
        self.running = [r.req_id for r in scheduler.running]
        self.gaps = {r.req_id: r.num_tokens_ahead - r.num_computed_tokens for r in scheduler.running}
        self.at_limit = {r.req_id for r in scheduler.running if scheduler._reached_limit(r)}
        self.drafting = {r.req_id for r in scheduler.running if r.num_drafts_in_flight}  # their outputs are not in
        self.keyed_blocks = {b.block_id for b in scheduler.kv.pool.blocks if b.key is not None}
        counters = scheduler.kv.prefix_index.counters
        self.num_queries, self.num_hits, self.num_evictions = (counters.num_queries, counters.num_hits,
                                                               counters.num_evictions)


class Run:
    """One scenario through the scheduler, checking every step."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.h = Harness(scenario.config, scenario.description(), eos_prob=scenario.eos_prob)
        self.s = self.h.scheduler
        self.accepted: dict[str, GenerateRequest] = {}
        self.aborted: set[str] = set()
        self.num_preemptions = 0
        self.writer_salt: dict[int, str | None] = {}  # block id -> cache salt of the request that last wrote it

    def add(self, arrival: Arrival) -> None:
        try:
            self.h.add(arrival.request)
        except RequestRejected:
            assert expect_rejected(self.scenario, arrival.request)
            return
        assert not expect_rejected(self.scenario, arrival.request)
        self.accepted[arrival.request.req_id] = arrival.request

    def abort(self, req_id: str) -> None:
        if req_id in self.accepted and self.h.abort(req_id):
            self.aborted.add(req_id)

    def go(self, max_steps: int = 3000) -> None:
        """Serially: schedule, run, feed. Async: schedule step N+1 (the worker runs it after step N), then feed step
        N's output; arrivals and aborts 'in flight' come between the schedule and the feed."""
        arrivals = self.scenario.arrivals
        in_flight: tuple[SchedulerOutput, StepOutput] | None = None  # async: the step whose output is not fed yet
        for step in range(max_steps):
            for a in arrivals:
                if a.step == step and not a.in_flight:
                    self.add(a)
                if a.abort_step == step and not a.abort_in_flight:
                    self.abort(a.request.req_id)
            if step > max(a.step for a in arrivals) and not (self.s.has_unfinished_requests()
                                                               or self.s.finished_req_ids or in_flight):
                return
            before = Before(self.s)
            scheduled = self.s.schedule()
            self.check_scheduled(scheduled, before)
            step_output = self.h.worker.execute_step(scheduled.step_input)
            for a in arrivals:
                if a.step == step and a.in_flight:
                    self.add(a)
                if a.abort_step == step and a.abort_in_flight:
                    self.abort(a.request.req_id)
            if self.scenario.async_scheduling:
                sent = (scheduled, step_output)
                if scheduled.step_input.is_empty and not scheduled.step_input.finished_req_ids:
                    sent = None  # nothing to send: the loop waits for the step in flight instead
                in_flight, (scheduled, step_output) = sent, in_flight or (None, None)
            if scheduled is not None:
                outputs = self.h.feed(scheduled, step_output)
                assert len({o.req_id for o in outputs}) == len(outputs)
            self.check_state()
        raise AssertionError(f"not done after {max_steps} steps: waiting {[r.req_id for r in self.s.waiting]}, "
                             f"running {[r.req_id for r in self.s.running]}")

    def check_scheduled(self, scheduled: SchedulerOutput, before: Before) -> None:
        step, config = scheduled.step_input, self.scenario.config
        num = step.num_scheduled_tokens
        assert step.total_num_scheduled_tokens <= config.max_num_batched_tokens + config.finish_slack
        assert len(num) <= config.max_num_seqs
        assert len(self.s.running) <= config.max_num_seqs
        assert all(n >= 1 for n in num.values())
        sent = [r.req_id for r in step.cached_requests] + [r.req_id for r in step.new_requests]
        assert sorted(sent) == sorted(num)  # each scheduled request once, as new or as cached
        # every request admitted took a token of some step, so the running ones never outnumber the budget and
        # all of them get their turn every step (the one continuing prefill, always the newest, takes the rest)
        skipped = before.at_limit | before.drafting
        if not (self.scenario.speculative and not num):  # a speculating batch may wait whole for the step in flight
            assert [r.req_id for r in self.s.running if r.req_id not in skipped] == list(num)
        assert self.s.counters.num_scheduled_tokens_last_step == step.total_num_scheduled_tokens
        # decodes first, then continuing prefills, then admissions (which carry everything as NewRequests)
        gaps = before.gaps
        kinds = ["new" if r not in gaps else "decode" if gaps[r] == 1 else "prefill" for r in num]
        assert kinds == sorted(kinds, key=["decode", "prefill", "new"].index), kinds
        assert all(r.req_id not in gaps for r in step.new_requests)
        if not config.enable_chunked_prefill:  # an admission is never split unless no step could hold it
            for new in step.new_requests:
                remaining = len(new.token_ids) - new.num_computed_tokens
                assert num[new.req_id] == remaining or remaining > config.max_num_batched_tokens
        self.check_preemptions(scheduled, before)
        self.check_blocks(scheduled, before)
        self.check_prefix_cache(scheduled, before)
        self.s.kv.check_integrity()

    def check_preemptions(self, scheduled: SchedulerOutput, before: Before) -> None:
        """Newest running first, to the front of the waiting queue; no admissions in that step."""
        step, victims = scheduled.step_input, scheduled.preempted_req_ids
        self.num_preemptions += len(victims)
        assert self.s.counters.num_preemptions == self.num_preemptions
        if not victims:
            return
        assert victims == before.running[::-1][:len(victims)]
        assert [r.req_id for r in self.s.waiting][:len(victims)] == victims[::-1]
        assert step.new_requests == []
        assert not set(victims) & set(step.num_scheduled_tokens)
        assert set(victims) <= set(step.finished_req_ids)
        for req_id in victims:
            request = self.s.requests[req_id]
            assert (request.status, request.num_computed_tokens) == (RequestStatus.PREEMPTED, 0)

    def check_blocks(self, scheduled: SchedulerOutput, before: Before) -> None:
        """Blocks cover exactly computed + scheduled tokens; admissions while others run leave the watermark."""
        step, kv = scheduled.step_input, self.s.kv
        for req_id in step.num_scheduled_tokens:
            request = self.s.requests[req_id]  # its computed tokens include this step's (and its drafts)
            assert request.num_computed_tokens <= request.num_tokens_ahead + len(step.draft_token_ids.get(req_id, ()))
            assert len(kv.block_ids(req_id)) == kv.blocks_needed(request.num_computed_tokens)
        num_running_at_admission = len(before.running) - len(scheduled.preempted_req_ids)
        if step.new_requests and (num_running_at_admission or len(step.new_requests) > 1):
            assert kv.pool.num_free_blocks >= kv.watermark_blocks

    def check_prefix_cache(self, scheduled: SchedulerOutput, before: Before) -> None:
        """Hits only on blocks written under the same salt; counters match what the step shows."""
        step, kv = scheduled.step_input, self.s.kv
        counters = kv.prefix_index.counters
        hit_blocks = set()
        for new in step.new_requests:
            num_hit = new.num_computed_tokens // kv.block_size
            salt = self.accepted[new.req_id].cache_salt
            assert all(self.writer_salt[b] == salt for b in new.block_ids[:num_hit]), new.req_id
            hit_blocks |= set(new.block_ids[:num_hit])
        fresh = {b for new in step.new_requests for b in new.block_ids} - hit_blocks
        fresh |= {b for cached in step.cached_requests for b in cached.new_block_ids}
        # counted once per prompt, at its first admission, and only with caching on
        first = [new for new in step.new_requests if self.s.requests[new.req_id].num_preemptions == 0]
        counted = first if kv.enable_prefix_caching else []
        assert counters.num_queries - before.num_queries == sum(len(new.token_ids) for new in counted)
        assert counters.num_hits - before.num_hits == sum(new.num_computed_tokens for new in counted)
        assert counters.num_evictions - before.num_evictions == len(fresh & before.keyed_blocks)
        # record who writes what this step, for later hits
        for req_id, n in step.num_scheduled_tokens.items():
            request = self.s.requests[req_id]
            block_ids = kv.block_ids(req_id)
            for position in range(request.num_computed_tokens - n, request.num_computed_tokens):
                self.writer_salt[block_ids[position // kv.block_size]] = request.cache_salt

    def check_state(self) -> None:
        kv, s = self.s.kv, self.s
        kv.check_integrity()
        for request in s.running:
            assert request.status is RequestStatus.RUNNING
            assert request.num_placeholders <= int(self.scenario.async_scheduling)  # the step in flight's
            assert (1 <= request.num_tokens_ahead - request.num_computed_tokens or s._reached_limit(request)
                    or request.num_drafts_in_flight)
            assert len(kv.block_ids(request.req_id)) == kv.blocks_needed(request.num_computed_tokens)
            assert request.num_tokens < self.scenario.max_model_len
            assert request.num_output_tokens < request.sampling.max_tokens
        for request in s.waiting:
            assert request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
            assert request.req_id not in kv.blocks_of
            assert not request.on_worker
        assert set(s.requests) == {r.req_id for r in s.running} | {r.req_id for r in s.waiting}
        assert set(self.h.worker.mirrors) == {r.req_id for r in s.running} | set(s.finished_req_ids)
        used = sum(1 for b in kv.pool.blocks if b.ref_count)
        assert s.snapshot_stats().kv_usage == pytest.approx(used / kv.pool.num_blocks)

    def check_end(self) -> None:
        kv = self.s.kv
        kv.check_integrity()
        assert kv.usage == 0.0
        assert kv.blocks_of == {}
        assert sorted(kv.pool.free_queue) == list(range(self.scenario.num_blocks))
        assert self.h.worker.mirrors == {}
        assert self.s.requests == {}
        finished = {req_id: self.h.streams[req_id] for req_id in self.accepted}
        assert all(stream.finish_reason is not None for stream in finished.values())
        assert sum(self.s.counters.num_finished.values()) == len(self.accepted)
        assert self.s.counters.num_finished.get("abort", 0) == len(self.aborted)
        for req_id, stream in finished.items():
            if req_id not in self.aborted:
                check_stop_rules(self.accepted[req_id], stream.token_ids, stream.finish_reason,
                                 self.scenario.max_model_len)


def check_stop_rules(request: GenerateRequest, tokens: list[int], reason: FinishReason, max_model_len: int) -> None:
    params = request.sampling
    stops = set(params.stop_token_ids) | (set() if params.ignore_eos else {EOS})
    assert 1 <= len(tokens) <= params.max_tokens
    assert len(request.prompt_token_ids) + len(tokens) <= max_model_len
    # no stop token once min_tokens outputs exist, except the last
    assert not [t for i, t in enumerate(tokens[:-1]) if i + 1 >= params.min_tokens and t in stops]
    if reason is FinishReason.STOP:
        assert tokens[-1] in stops
        assert len(tokens) >= params.min_tokens
    else:
        assert reason is FinishReason.LENGTH
        assert len(tokens) == params.max_tokens or len(request.prompt_token_ids) + len(tokens) == max_model_len


def run_alone(scenario: Scenario, request: GenerateRequest) -> tuple[list[int], FinishReason | None]:
    """The request alone, in a big pool, without speculation."""
    h = Harness(SchedulerConfig(max_num_batched_tokens=4096), scenario.description(num_blocks=512),
                eos_prob=scenario.eos_prob)
    h.add(request)
    h.run()
    stream = h.streams[request.req_id]
    return stream.token_ids, stream.finish_reason


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_workloads_keep_every_invariant(scenario: Scenario):
    run = Run(scenario)
    run.go()
    run.check_end()
    stats = run.s.snapshot_stats()
    event(f"accepted {len(run.accepted)} of {len(scenario.arrivals)}")
    event("preempted" if stats.num_preemptions else "no preemption")
    event("prefix hit" if stats.prefix_cache_hits else "no prefix hit")
    event("aborted" if run.aborted else "no abort")


PRESSURE = scenarios(caching=True, min_requests=4, min_stem=6, pool_sizes=(12, 16, 24, 32))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(PRESSURE)
def test_shared_prefixes_under_pool_pressure_keep_every_invariant(scenario: Scenario):
    run = Run(scenario)
    run.go()
    run.check_end()
    stats = run.s.snapshot_stats()
    event("preempted" if stats.num_preemptions else "no preemption")
    event("prefix hit" if stats.prefix_cache_hits else "no prefix hit")
    event("evicted" if stats.prefix_cache_evictions else "no eviction")
    event("deferred" if stats.num_prefix_deferrals else "no deferral")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(scenarios(), PRESSURE))
def test_outputs_do_not_depend_on_batching_chunking_caching_or_preemption(scenario: Scenario):
    """The fake worker is greedy: a request's tokens are a function of its history, so they must match a solo run."""
    run = Run(scenario)
    run.go()
    for req_id, request in run.accepted.items():
        if req_id not in run.aborted:
            stream = run.h.streams[req_id]
            assert (stream.token_ids, stream.finish_reason) == run_alone(scenario, request), req_id


SPECULATING = st.one_of(scenarios(speculative=True), scenarios(caching=True, min_requests=4, min_stem=6,
                                                               pool_sizes=(12, 16, 24, 32), speculative=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPECULATING)
def test_speculation_keeps_every_invariant_and_the_outputs(scenario: Scenario):
    """Drafts in the budget, their slots reserved and the rejected tail freed, with arrivals, aborts and preemptions
    in flight: every invariant holds, everything ends free, and each request's tokens are its solo plain run's."""
    run = Run(scenario)
    run.go()
    run.check_end()
    for req_id, request in run.accepted.items():
        if req_id not in run.aborted:
            stream = run.h.streams[req_id]
            assert (stream.token_ids, stream.finish_reason) == run_alone(scenario, request), req_id
    counters = run.s.drafts.counters
    event("drafted" if counters.num_drafts else "no drafts")
    event("accepted" if sum(counters.num_accepted_per_position) else "none accepted")
    event("preempted" if run.s.snapshot_stats().num_preemptions else "no preemption")
    event("aborted" if run.aborted else "no abort")
