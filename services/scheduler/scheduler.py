"""Continuous batching: every step, decodes first, then prefill chunks, then admissions, within a token budget.

There is no prefill or decode phase: each request only has `num_computed_tokens` catching up with its tokens.
A decode is a request one token behind; a chunked prefill or a prefix hit is just a bigger gap.

Async scheduling (the engine loop plans step N+1 while the worker runs step N) needs no mode here, only an order
of calls: `schedule()` may run again before the last step's `update_from_output`. A step advances
`num_computed_tokens` when it is scheduled, and a request whose step reaches the end of its tokens gets a
placeholder for the token the worker will sample; the next step computes that token (the worker mirrors it), and
the output replaces the placeholder. Outputs of steps sent before a request finished, was aborted or replaced are
dropped, so a request that stops at step N streams nothing from step N+1; a request preempted while its step ran
keeps the token that step sampled. A request whose placeholders already take it to its length limit is not
scheduled again.

Priority and fair share: the waiting queue (WaitingQueue) takes the most urgent priority first, then the tenant
with the least recent service over its weight (FairShare, charged with each step's tokens), then first come, first
served. Running requests are kept by priority (admission order within one), so decodes of urgent requests get the
budget first. A waiting request finding no free slot takes one from a running request of a less urgent priority
(preempted: the least urgent, then a tenant over its KV-block quota, then the most over-served tenant, then the
newest); preemption for KV blocks picks its victims in the same order among the requests not yet scheduled in the
step. With one priority and one tenant all of
this is first come, first served and the newest is preempted first.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field, replace

from pagedserve.services.scheduler.fair_share import FairShare
from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager, PrefixHit
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.scheduler_config import SchedulerConfig
from pagedserve.services.scheduler.scheduler_counters import SchedulerCounters
from pagedserve.services.scheduler.spec_decode.planner import NO_DRAFTS, DraftPlanner, Drafts
from pagedserve.services.scheduler.stop_checker import check_stop
from pagedserve.services.scheduler.waiting_queue import WaitingQueue
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput
from pagedserve.shared.scheduler_stats import SchedulerStats
from pagedserve.shared.speculative_config import SpeculativeConfig
from pagedserve.shared.step_protocol import (
    CachedRequest,
    FailedRequest,
    ModelDescription,
    NewRequest,
    StepInput,
    StepOutput,
)


class RequestRejected(ValueError):
    """A request that can never run here (too long for the context or the pool); maps to a 400."""


@dataclass
class SchedulerOutput:
    step_input: StepInput  # what the worker runs
    preempted_req_ids: list[str] = field(default_factory=list)
    # the scheduled requests as they were then: update_from_output takes outputs only for the same live objects
    requests: dict[str, Request] = field(default_factory=dict)


class Scheduler:
    def __init__(self, config: SchedulerConfig, description: ModelDescription) -> None:
        self.config = config
        self.description = description
        self.kv = KVCacheManager(description.num_kv_blocks, description.block_size, config.enable_prefix_caching,
                                 config.watermark)
        self.requests: dict[str, Request] = {}
        self.fair_share = FairShare()
        self.waiting = WaitingQueue(self.fair_share)
        self.preparing: dict[str, Request] = {}  # waiting for the worker to compile their grammar: not admitted yet
        self.running: list[Request] = []  # by priority, then admission order
        self.finished_req_ids: list[str] = []  # to drop from the worker with the next step
        self.counters = SchedulerCounters()
        speculative = SpeculativeConfig.from_json(config.speculative_config)
        self.drafts = DraftPlanner(speculative, description.max_model_len) if speculative else None

    # --- requests in and out -------------------------------------------------------------------------------

    def add_request(self, generate: GenerateRequest) -> None:
        if generate.req_id in self.requests:
            raise RequestRejected(f"request id {generate.req_id!r} is already in use")
        self._validate(generate)
        request = Request.from_generate(generate)
        self.requests[request.req_id] = request
        if generate.sampling.structured_output is not None:
            self.preparing[request.req_id] = request
        else:
            self.waiting.append(request)

    def grammar_ready(self, req_id: str) -> bool:
        """The worker compiled the request's grammar: it may be admitted now. False when it is gone (aborted)."""
        request = self.preparing.pop(req_id, None)
        if request is None:
            return False
        self.waiting.append(request)
        return True

    def _validate(self, generate: GenerateRequest) -> None:
        description = self.description
        num_prompt, limit = len(generate.prompt_token_ids), description.max_model_len
        if num_prompt == 0:
            raise RequestRejected("the prompt is empty")
        if not generate.tenant_weight > 0:
            raise RequestRejected(f"the tenant's weight must be positive, not {generate.tenant_weight}")
        share = generate.tenant_kv_cache_share
        if share is not None and not 0.0 < share <= 1.0:
            raise RequestRejected(f"the tenant's KV cache share must be in (0, 1], not {share}")
        if num_prompt >= limit:
            raise RequestRejected(f"the prompt has {num_prompt} tokens but this model's context limit is {limit} "
                                  f"tokens (at least one must remain for the output)")
        self._validate_resumed(generate)
        max_tokens = min(num_prompt + generate.sampling.max_tokens, limit)
        if self.kv.blocks_needed(max_tokens) > description.num_kv_blocks:
            raise RequestRejected(
                f"the request needs up to {max_tokens} tokens of KV cache "
                f"({self.kv.blocks_needed(max_tokens)} blocks) but the whole pool holds "
                f"{description.num_kv_blocks * description.block_size} tokens ({description.num_kv_blocks} blocks)")
        for what, token_ids in (("", generate.prompt_token_ids), ("logit_bias: ", generate.sampling.logit_bias),
                                ("stop_token_ids: ", generate.sampling.stop_token_ids),
                                ("resumed_output_token_ids: ", generate.resumed_output_token_ids)):
            bad = next((t for t in token_ids if not 0 <= t < description.vocab_size), None)
            if bad is not None:
                raise RequestRejected(f"{what}token id {bad} is out of the vocabulary (size {description.vocab_size})")

    def _validate_resumed(self, generate: GenerateRequest) -> None:
        """A continuation must leave something to generate: max_tokens and the context limit count its outputs."""
        num_resumed, max_tokens = len(generate.resumed_output_token_ids), generate.sampling.max_tokens
        if num_resumed >= max_tokens:
            raise RequestRejected(f"resumed_output_token_ids has {num_resumed} tokens but max_tokens is {max_tokens}: "
                                  f"max_tokens counts the resumed tokens, so nothing would be left to generate")
        num_tokens, limit = len(generate.prompt_token_ids) + num_resumed, self.description.max_model_len
        if num_resumed and num_tokens >= limit:
            raise RequestRejected(f"the prompt and resumed_output_token_ids have {num_tokens} tokens but this "
                                  f"model's context limit is {limit} tokens (at least one must remain for the output)")

    def abort_request(self, req_id: str) -> bool:
        """Drop a request at any time; its blocks are free at once. False when it was unknown or finished."""
        request = self.requests.get(req_id)
        if request is None or request.is_finished:
            return False
        self._finish(request, FinishReason.ABORT)
        return True

    def hand_off_all(self) -> list[RequestOutput]:
        """Draining: end every unfinished request with HANDOFF (its blocks freed, outputs of steps in flight for it
        dropped as after an abort), to be resumed on another replica from the tokens already reported; one final
        output each, carrying any token not yet reported."""
        outputs = []
        for request in list(self.requests.values()):
            self._finish(request, FinishReason.HANDOFF)
            unreported = request.num_output_tokens - request.num_outputs_reported
            outputs.append(self._output(request, [None] * unreported))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.preparing)

    def has_schedulable_requests(self) -> bool:
        """Requests a step could take now (those whose grammar is still compiling are not)."""
        return bool(self.waiting or self.running)

    # --- one step ------------------------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        speculate = self.drafts is not None and self.drafts.enabled_for(len(self.running) + len(self.waiting))
        if speculate and self.drafts.waits_for_step_in_flight(self.running):
            # nothing now: the whole batch goes out once the step in flight is back (see spec_decode/planner.py)
            self.counters.record_step(0, 0)
            return SchedulerOutput(StepInput(incarnation_id=self.description.incarnation_id))
        budget = self.config.max_num_batched_tokens
        step = StepInput(finished_req_ids=self.finished_req_ids, incarnation_id=self.description.incarnation_id)
        scheduled = SchedulerOutput(step)
        self.finished_req_ids = []
        self.fair_share.advance()
        for_slots = self._preempt_for_urgent()
        preempted: list[Request] = []  # for KV blocks
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if self._reached_limit(request) or request.num_drafts_in_flight:
                index += 1
                continue  # the steps in flight take it to its length limit, or its drafts' outcome is not known yet
            num_new = self._chunk(request.num_tokens_ahead - request.num_computed_tokens, budget)
            # drafts never take the token a running request after this one needs this step
            draft_budget = budget - num_new - (len(self.running) - index - 1)
            drafts = self._drafts(request, draft_budget) if speculate and num_new == 1 else NO_DRAFTS
            if not self._allocate_or_preempt(request, num_new, index, preempted):
                continue  # the request preempted itself: the one after it is at `index` now
            self._schedule(request, num_new, scheduled, drafts)
            budget -= num_new + drafts.count
            index += 1
        for request in itertools.chain(for_slots, preempted):
            if request.on_worker:
                step.finished_req_ids.append(request.req_id)
                request.on_worker = False
        if not preempted:
            self._admit(budget, scheduled)
        self.counters.record_step(step.total_num_scheduled_tokens, len(for_slots) + len(preempted))
        scheduled.preempted_req_ids = [r.req_id for r in itertools.chain(for_slots, preempted)]
        return scheduled

    def _preempt_for_urgent(self) -> list[Request]:
        """Preempt running requests for waiting ones of a more urgent priority that would find no free slot."""
        most_urgent = self.waiting.most_urgent_priority
        if most_urgent is None or not self.running or most_urgent >= self.running[-1].priority:
            return []  # nothing waits that is more urgent than the least urgent running request (the usual case)
        free = self.config.max_num_seqs - len(self.running)
        least_urgent = self.running[-1].priority
        urgent = itertools.takewhile(lambda r: r.priority < least_urgent, self.waiting)
        urgent = list(itertools.islice(urgent, self.config.max_num_seqs))  # more could not all get a slot anyway
        victims: list[Request] = []
        for request in urgent:
            if free > 0:
                free -= 1
                continue
            if self.running[self._victim_index()].priority <= request.priority:
                break
            victim = self.running.pop(self._victim_index())
            self._preempt(victim)
            victims.append(victim)
        return victims

    def _victim_index(self, start: int = 0) -> int:
        """Whom of running[start:] to preempt first: the least urgent priority, then a tenant over its KV-block
        quota, then the most over-served tenant, then the newest (the last in running of those)."""
        running, share, over = self.running, self.fair_share.share, self.kv.over_quota
        return max(range(start, len(running)),
                   key=lambda i: (running[i].priority, over(running[i].tenant), share(running[i].tenant), i))

    def _drafts(self, request: Request, budget_left: int) -> Drafts:
        """A decode's drafts, their KV slots reserved; none when the pool has no room for them."""
        drafts = self.drafts.drafts(request, budget_left)
        if drafts.count and self.kv.allocate_slots(request, 1 + drafts.count) is None:
            return NO_DRAFTS
        return drafts

    def _reached_limit(self, request: Request) -> bool:
        """Whether the tokens being sampled in steps in flight already end the request by length."""
        return request.num_placeholders > 0 and (
            request.num_output_tokens + request.num_placeholders >= request.sampling.max_tokens
            or request.num_tokens_ahead >= self.description.max_model_len)

    def _chunk(self, num_left: int, budget: int) -> int:
        """How many of a request's `num_left` tokens to compute now: all of them when they fit the budget or pass
        it by no more than the finish slack (no short tail left for the next step), else the budget."""
        return num_left if num_left <= budget + self.config.finish_slack else budget

    def _allocate_or_preempt(self, request: Request, num_new: int, index: int, preempted: list[Request]) -> bool:
        """Get blocks for the request (at `index` in running) for its next tokens, preempting requests not yet
        scheduled in this step (itself included) until it fits, in `_victim_index`'s order; False when it was
        preempted."""
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self.running.pop(self._victim_index(index))
            self._preempt(victim)
            preempted.append(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_blocks_on_worker = 0
        request.num_preemptions += 1
        self.waiting.appendleft(request)

    def _admit(self, budget: int, scheduled: SchedulerOutput) -> None:
        deferred: list[Request] = []  # sitting out this step, in queue order
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.peek()
            if request.num_placeholders:  # preempted while a step ran: its tokens are not all known yet
                self.waiting.remove(request)
                deferred.append(request)
                continue
            prefix = self.kv.find_prefix(request)
            # a running request is computing the next block this one needs: wait for the hit instead of redoing it
            if self.kv.prefix_in_flight(request, prefix):
                self.waiting.remove(request)
                deferred.append(request)
                self.counters.record_deferral()
                continue
            num_computed = prefix.num_tokens(self.kv.block_size)
            num_new = request.num_tokens - num_computed
            # without chunked prefill a prefill waits for a step with room, unless no step could ever hold it
            # (a request resumed after preemption is prompt + outputs, which may exceed the budget)
            if not self.config.enable_chunked_prefill and budget < num_new <= self.config.max_num_batched_tokens:
                break
            num_new = self._chunk(num_new, budget) if self.config.enable_chunked_prefill else min(num_new, budget)
            # the watermark protects running decodes; with none running it would only keep a big request out forever
            if self.kv.allocate_slots(request, num_new, prefix, admission=bool(self.running)) is None:
                break
            self.waiting.remove(request)
            self._start(request, num_computed, prefix)
            self._schedule(request, num_new, scheduled)
            budget -= num_new
        for request in reversed(deferred):
            self.waiting.appendleft(request)

    def _start(self, request: Request, num_computed: int, prefix: PrefixHit) -> None:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_computed
        self.kv.mark_in_flight(request, prefix)
        if request.num_cached_tokens is None:  # first admission: resumptions after preemption are not counted
            request.num_cached_tokens = min(num_computed, request.num_prompt_tokens)  # a resumed one hits outputs too
            self.kv.record_prefix_query(request.num_tokens, prefix)
        # after every running request of its priority or a more urgent one
        self.running.insert(bisect.bisect_right(self.running, request.priority, key=lambda r: r.priority), request)

    def _schedule(self, request: Request, num_new: int, scheduled: SchedulerOutput,
                  drafts: Drafts = NO_DRAFTS) -> None:
        """Add the request to the step, as a new mirror or as the delta since its last step, and count the step's
        tokens as computed (a step that reaches the end of its tokens samples one more: a placeholder until then).
        Draft positions are computed after the last known one (their tokens sent, or a draft model's slots counted);
        until the output settles them (DraftPlanner.settle) they count as computed and the step holds one
        placeholder."""
        step = scheduled.step_input
        block_ids = self.kv.block_ids(request.req_id)
        if request.on_worker:
            step.cached_requests.append(CachedRequest(
                request.req_id, block_ids[request.num_blocks_on_worker:], request.num_computed_tokens))
        else:
            step.new_requests.append(NewRequest(
                request.req_id, list(request.token_ids), request.num_prompt_tokens, request.sampling, block_ids,
                request.num_computed_tokens))
            request.on_worker = True
        request.num_blocks_on_worker = len(block_ids)
        step.num_scheduled_tokens[request.req_id] = num_new
        scheduled.requests[request.req_id] = request
        request.num_computed_tokens += num_new
        self.fair_share.charge(request.tenant, num_new, request.tenant_weight)
        if request.num_computed_tokens == request.num_tokens_ahead:
            request.num_placeholders += 1
        if drafts.count:
            if drafts.token_ids:
                step.draft_token_ids[request.req_id] = list(drafts.token_ids)
            else:
                step.draft_model_slots[request.req_id] = drafts.num_worker_slots
            step.num_scheduled_tokens[request.req_id] += drafts.count
            request.num_computed_tokens += drafts.count
            request.num_drafts_in_flight = drafts.count

    # --- after the worker ran the step ---------------------------------------------------------------------

    def update_from_output(self, scheduled: SchedulerOutput, output: StepOutput) -> list[RequestOutput]:
        """Index the blocks the step filled, append sampled tokens, apply stop conditions; one output per request
        that sampled. Steps come back in the order they were scheduled. A request the worker failed finishes with
        ERROR (its output carries the error), its blocks freed and none of this step's indexed."""
        outputs = [self._fail(scheduled.requests[failure.req_id], failure) for failure in output.failed
                   if self._live(scheduled, failure.req_id)]
        for req_id, num_accepted in output.num_accepted_drafts.items():
            if self._live(scheduled, req_id):
                self.drafts.settle(scheduled.requests[req_id], num_accepted, self.kv)
        for request in scheduled.requests.values():
            if request.status is RequestStatus.RUNNING and self.requests.get(request.req_id) is request:
                self.kv.cache_full_blocks(request)
        emitted: dict[str, tuple[Request, list]] = {}  # one output per request, with every token it took this step
        for req_id, token_id, logprobs in zip(output.req_ids, output.sampled_token_ids, output.logprobs,
                                              strict=True):
            request = scheduled.requests.get(req_id)
            if request is None or self.requests.get(req_id) is not request:
                continue  # finished or aborted since the step was scheduled (or by an earlier token of this step)
            assert request.num_placeholders > 0, f"request {req_id} sampled a token no step was due to sample"
            request.num_placeholders -= 1
            request.token_ids.append(token_id)
            self.counters.record_token(request.num_prompt_tokens, is_first=request.num_output_tokens == 1)
            reason = check_stop(request, token_id, self.description.eos_token_ids, self.description.max_model_len)
            if reason is not None:
                self._finish(request, reason)
            emitted.setdefault(req_id, (request, []))[1].append(logprobs)
        outputs.extend(self._with_prompt_logprobs(self._output(request, logprobs), request, output)
                       for request, logprobs in emitted.values())
        return outputs

    @staticmethod
    def _with_prompt_logprobs(out: RequestOutput, request: Request, output: StepOutput) -> RequestOutput:
        """The worker's prompt logprobs go out with the request's first output; a later copy (the prompt computed
        again after a preemption) is dropped."""
        prompt_logprobs = output.prompt_logprobs.get(request.req_id)
        if prompt_logprobs is None or request.prompt_logprobs_reported:
            return out
        request.prompt_logprobs_reported = True
        return replace(out, prompt_logprobs=prompt_logprobs)

    def _live(self, scheduled: SchedulerOutput, req_id: str) -> bool:
        """Whether the request the step scheduled under this id is still the live one."""
        request = scheduled.requests.get(req_id)
        return request is not None and self.requests.get(req_id) is request

    def _fail(self, request: Request, failure: FailedRequest) -> RequestOutput:
        request.on_worker = False  # the worker dropped its mirror itself
        self._finish(request, FinishReason.ERROR)
        return replace(self._output(request, []), error=failure)

    def _output(self, request: Request, logprobs: list) -> RequestOutput:
        new_tokens = request.output_token_ids[request.num_outputs_reported:]
        request.num_outputs_reported = request.num_output_tokens
        return RequestOutput(request.req_id, new_tokens, logprobs, request.finish_reason, request.num_prompt_tokens,
                             request.num_cached_tokens or 0, request.num_output_tokens)

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            self.preparing.pop(request.req_id, None)
        self.kv.free(request)
        if request.on_worker:
            self.finished_req_ids.append(request.req_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.req_id]
        self.counters.record_finish(reason)

    def snapshot_stats(self) -> SchedulerStats:
        num_waiting = len(self.waiting) + len(self.preparing)  # a request compiling its grammar waits too
        return self.counters.snapshot(num_running=len(self.running), num_waiting=num_waiting,
                                      kv_usage=self.kv.usage, num_kv_blocks=self.description.num_kv_blocks,
                                      prefix=self.kv.prefix_index.counters,
                                      kv_blocks_by_tenant=self.kv.blocks_by_tenant())
