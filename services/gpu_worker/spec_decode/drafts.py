"""Put a step's draft tokens on the request mirrors, after checking they fit the step: the scheduler's (n-gram)
or those the worker's draft model proposes for the positions the scheduler reserved."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.step_protocol import FailedRequest, StepInput

log = logging.getLogger(__name__)
Propose = Callable[[list[RequestState], list[int]], None]  # DraftModelProposer.propose


def attach_drafts(step: StepInput, requests: dict[str, RequestState]) -> dict[str, FailedRequest]:
    """Drafts follow the request's last known token, which the step computes: the step schedules 1 + len(drafts)
    tokens from exactly there. A request whose drafts break that fails alone and its mirror is dropped."""
    failed: dict[str, FailedRequest] = {}
    for req_id, drafts in step.draft_token_ids.items():
        state = requests.get(req_id)
        if state is None:
            continue  # failed its delta, or unknown: reported as such
        problem = _problem(state, len(drafts), step.num_scheduled_tokens.get(req_id, 0))
        if problem is None:
            state.draft_token_ids = list(drafts)
            continue
        del requests[req_id]
        failed[req_id] = FailedRequest(req_id, f"draft tokens refused: {problem}", invalid_argument=False)
    return failed


def attach_model_drafts(step: StepInput, requests: dict[str, RequestState], propose: Propose | None
                        ) -> dict[str, FailedRequest]:
    """Run the draft model for the requests given draft positions (`propose` None: this worker has none). A request
    whose positions do not fit its mirror, or whose draft forward fails, fails alone and its mirror is dropped."""
    failed: dict[str, FailedRequest] = {}
    drafting: list[RequestState] = []
    for req_id, count in step.draft_model_slots.items():
        state = requests.get(req_id)
        if state is None:
            continue  # failed its delta, or unknown: reported as such
        problem = "this worker runs no draft model (give it the scheduler's --speculative-config)" \
            if propose is None else _problem(state, count, step.num_scheduled_tokens.get(req_id, 0))
        if problem is None:
            drafting.append(state)
            continue
        del requests[req_id]
        failed[req_id] = FailedRequest(req_id, f"draft positions refused: {problem}", invalid_argument=False)
    if drafting and propose is not None:
        try:
            propose(drafting, [step.draft_model_slots[s.req_id] for s in drafting])
        except Exception:
            log.exception("the draft model failed on %d requests", len(drafting))
            for state in drafting:
                del requests[state.req_id]
                failed[state.req_id] = FailedRequest(state.req_id, "the draft model failed", invalid_argument=False)
    return failed


def _problem(state: RequestState, num_drafts: int, num_scheduled: int) -> str | None:
    if num_drafts < 1:
        return "an empty draft"
    if (num_scheduled != 1 + num_drafts or state.num_computed_tokens != len(state.token_ids) - 1
            or state.pending is not None):
        return (f"{num_drafts} drafts for {num_scheduled} scheduled tokens at {state.num_computed_tokens} computed "
                f"of {state.num_tokens}")
    return None
