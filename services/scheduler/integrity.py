"""The scheduler's leak check, reachable over gRPC and run by the engine loop when it idles in debug mode
(--check-integrity-when-idle): the KV-block accounting, every request in exactly one state, and agreement between
the engine's open streams and the Scheduler's requests (no block held by a request that finished).

The checks are plain code (services/scheduler/invariants.py), not `assert`: under `python -O` they still run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedserve.services.scheduler.invariants import InvariantViolated, require
from pagedserve.shared.integrity_report import IntegrityReport

if TYPE_CHECKING:
    from pagedserve.services.scheduler.scheduler import Scheduler


def check_integrity(scheduler: Scheduler, live_req_ids: set[str]) -> IntegrityReport:
    """`live_req_ids`: the requests whose streams are open. Never raises: a failed check is in the report."""
    blocks = scheduler.kv.pool.blocks
    num_used = sum(1 for b in blocks if b.ref_count > 0)
    num_cached = sum(1 for b in blocks if b.ref_count == 0 and b.key is not None)
    try:
        _check(scheduler, live_req_ids)
        problem = ""
    except InvariantViolated as exc:
        problem = str(exc) or "an integrity check failed"
    return IntegrityReport(ok=not problem, problem=problem, num_blocks=len(blocks),
                           num_free_blocks=len(blocks) - num_used - num_cached, num_cached_blocks=num_cached,
                           num_used_blocks=num_used, num_live_requests=len(live_req_ids),
                           worker_incarnation_id=scheduler.description.incarnation_id)


def require_integrity(scheduler: Scheduler, live_req_ids: set[str]) -> IntegrityReport:
    """check_integrity, raising InvariantViolated with the report's problem when a check fails."""
    report = check_integrity(scheduler, live_req_ids)
    require(report.ok, f"scheduler integrity: {report.problem}")
    return report


def _check(scheduler: Scheduler, live_req_ids: set[str]) -> None:
    scheduler.kv.check_integrity()
    requests = set(scheduler.requests)
    holders = set(scheduler.kv.blocks_of)
    require(holders <= requests, f"finished requests hold blocks: {holders - requests}")
    require(requests == live_req_ids, f"scheduler requests {sorted(requests)} != open streams {sorted(live_req_ids)}")
    states = ({r.req_id for r in scheduler.waiting}, {r.req_id for r in scheduler.running}, set(scheduler.preparing))
    require(sum(len(ids) for ids in states) == len(requests) and set().union(*states) == requests,
            "a request is in none of waiting, running and preparing, or in two")
