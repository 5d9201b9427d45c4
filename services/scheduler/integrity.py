"""The scheduler's leak check, reachable over gRPC: the KV-block accounting plus agreement between the engine's
open streams and the Scheduler's requests (no block held by a request that finished)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.integrity_report import IntegrityReport

if TYPE_CHECKING:
    from services.scheduler.scheduler import Scheduler


def check_integrity(scheduler: Scheduler, live_req_ids: set[str]) -> IntegrityReport:
    """`live_req_ids`: the requests whose streams are open. Never raises: a failed check is in the report."""
    blocks = scheduler.kv.pool.blocks
    num_used = sum(1 for b in blocks if b.ref_count > 0)
    num_cached = sum(1 for b in blocks if b.ref_count == 0 and b.key is not None)
    problem = ""
    try:
        scheduler.kv.check_integrity()
        assert num_used + num_cached + sum(1 for b in blocks if b.ref_count == 0 and b.key is None) == len(blocks)
        holders = set(scheduler.kv.blocks_of)
        assert holders <= set(scheduler.requests), f"finished requests hold blocks: {holders - set(scheduler.requests)}"
        assert set(scheduler.requests) == live_req_ids, (
            f"scheduler requests {sorted(scheduler.requests)} != open streams {sorted(live_req_ids)}")
        queued = {r.req_id for r in scheduler.waiting} | {r.req_id for r in scheduler.running}
        assert queued == set(scheduler.requests), "a request is neither waiting nor running, or both"
    except AssertionError as exc:
        problem = str(exc) or "an integrity assertion failed"
    return IntegrityReport(ok=not problem, problem=problem, num_blocks=len(blocks),
                           num_free_blocks=len(blocks) - num_used - num_cached, num_cached_blocks=num_cached,
                           num_used_blocks=num_used, num_live_requests=len(live_req_ids),
                           worker_incarnation_id=scheduler.description.incarnation_id)
