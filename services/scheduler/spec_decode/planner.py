"""Which requests speculate in a step, with which drafts, and what a verified step leaves behind.

Contract with the Scheduler (scheduler.py calls these from its decode loop and from update_from_output):
- Drafts come from the n-gram proposer here (their tokens travel in the step) or, with a draft model, from the
  worker (only their count travels: `StepInput.draft_model_slots`); either way the same positions are budgeted,
  reserved and settled, so nothing below depends on the method.
- A request speculates only as a plain decode (one known token left to compute), with no step in flight for it
  (a request under a grammar drafts too: the worker masks each verification row with the grammar state after the
  drafts before it and rolls its matcher back past the rejected ones). Drafts are capped so that even if all are
  accepted plus the bonus token the request passes neither `max_tokens` nor the context limit, and by what is
  left of the step's token budget once every running request still to be scheduled has its one token.
- While its drafted step is in flight the request cannot be scheduled again (async scheduling: the next step cannot
  know how many tokens it accepts). A request whose plain step is in flight cannot draft either (its last token is
  unknown): it waits for that step when its context's tail recurs (`holds_back`: it is copying, drafts are likely;
  a draft model can always propose, so with one it always waits), else it keeps the usual placeholder pipelining.
- The batch is not split while speculating (`waits_for_step_in_flight`): when any running request waits for the
  step in flight, the scheduler plans nothing until that step is back and then plans the whole batch. Speculation
  runs only at small batches, where a step's cost is mostly reading the weights, so a step for part of the batch
  costs nearly as much as one for all of it (overlapping part-batches would run each request in every other
  step). Requests that cannot draft and never wait keep pipelining as without speculation.
- `settle` runs first when the step's output comes back: the request rolls back its computed tokens past the
  accepted drafts and frees the blocks the rejected tail held (the worker applies the same rule to its mirror), so
  prefix-cache hashes, which cover only `token_ids`, only ever see accepted tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.scheduler.kv_cache_manager import KVCacheManager
from pagedserve.services.scheduler.request import Request, RequestStatus
from pagedserve.services.scheduler.spec_decode.counters import SpecDecodeCounters
from pagedserve.services.scheduler.spec_decode.ngram_proposer import NgramProposer
from pagedserve.shared.speculative_config import SpeculativeConfig


@dataclass(frozen=True)
class Drafts:
    """A decode's draft positions in one step: the tokens proposed here, or a count the worker's draft model fills."""

    token_ids: tuple[int, ...] = ()
    num_worker_slots: int = 0  # draft model: positions the worker proposes for (token_ids is then empty)

    @property
    def count(self) -> int:
        return len(self.token_ids) + self.num_worker_slots


NO_DRAFTS = Drafts()


class DraftPlanner:
    def __init__(self, config: SpeculativeConfig, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.proposer = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
        self.counters = SpecDecodeCounters()

    def enabled_for(self, num_requests: int) -> bool:
        """Speculation is off for a step while this many requests run or wait to (it would cost compute the batch
        needs, and a burst of arrivals would start drafting before it is admitted and then wait for the drafts)."""
        limit = self.config.disable_by_batch_size
        return limit == 0 or num_requests < limit

    def drafts(self, request: Request, budget_left: int) -> Drafts:
        """The drafts of a request about to be scheduled as a one-token decode (none: no speculation)."""
        if request.num_placeholders:
            return NO_DRAFTS
        cap = min(self.config.num_speculative_tokens, budget_left,
                  request.sampling.max_tokens - request.num_output_tokens - 1,
                  self.max_model_len - request.num_tokens - 1)
        if cap < 1:
            return NO_DRAFTS
        if self.config.uses_draft_model:
            return Drafts(num_worker_slots=cap)
        return Drafts(token_ids=tuple(self.proposer.propose(request.token_ids, cap)))

    def waits_for_step_in_flight(self, running: list[Request]) -> bool:
        """Whether some running request needs the output of the step in flight before it can be scheduled to draft
        (its drafts are in flight, or it holds back): the next step then waits for that output."""
        return any(request.num_drafts_in_flight or self.holds_back(request) for request in running)

    def holds_back(self, request: Request) -> bool:
        """Whether a request with a plain step in flight waits for it, so that its next step can draft from the
        token that one samples: only when its known context's tail recurs (it is copying). Else it keeps pipelining
        plain decodes."""
        if self.config.uses_draft_model:
            return request.num_placeholders > 0
        return request.num_placeholders > 0 and bool(self.proposer.propose(request.token_ids, 1))

    def settle(self, request: Request, num_accepted: int, kv: KVCacheManager) -> None:
        """Apply a verified step's acceptance: the step samples `num_accepted` + 1 tokens (placeholders for them);
        a running request keeps its KV only up to the last accepted draft and gives back the rejected tail's blocks."""
        num_drafts = request.num_drafts_in_flight
        assert 0 <= num_accepted <= num_drafts, f"request {request.req_id}: {num_accepted} of {num_drafts} accepted"
        self.counters.record(num_drafts, num_accepted)
        request.num_drafts_in_flight = 0
        request.num_placeholders += num_accepted
        if request.status is RequestStatus.RUNNING:
            request.num_computed_tokens -= num_drafts - num_accepted
            kv.free_tail(request, request.num_computed_tokens)
            request.num_blocks_on_worker = len(kv.block_ids(request.req_id))
