"""Put a step's draft tokens on the request mirrors, after checking they fit the step."""

from __future__ import annotations

from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.shared.step_protocol import FailedRequest, StepInput


def attach_drafts(step: StepInput, requests: dict[str, RequestState]) -> dict[str, FailedRequest]:
    """Drafts follow the request's last known token, which the step computes: the step schedules 1 + len(drafts)
    tokens from exactly there. A request whose drafts break that fails alone and its mirror is dropped."""
    failed: dict[str, FailedRequest] = {}
    for req_id, drafts in step.draft_token_ids.items():
        state = requests.get(req_id)
        if state is None:
            continue  # failed its delta, or unknown: reported as such
        problem = _problem(state, drafts, step.num_scheduled_tokens.get(req_id, 0))
        if problem is None:
            state.draft_token_ids = list(drafts)
            continue
        del requests[req_id]
        failed[req_id] = FailedRequest(req_id, f"draft tokens refused: {problem}", invalid_argument=False)
    return failed


def _problem(state: RequestState, drafts: list[int], num_scheduled: int) -> str | None:
    if not drafts:
        return "an empty draft"
    if num_scheduled != 1 + len(drafts) or state.num_computed_tokens != len(state.token_ids) - 1:
        return (f"{len(drafts)} drafts for {num_scheduled} scheduled tokens at {state.num_computed_tokens} computed "
                f"of {len(state.token_ids)}")
    return None
