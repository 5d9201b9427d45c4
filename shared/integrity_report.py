"""The scheduler's leak-check result: filled by services/scheduler/integrity.py, carried by the CheckIntegrity RPC
(field names are the IntegrityReport message's), read by the fault tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IntegrityReport:
    ok: bool
    problem: str  # the first check that failed; empty when ok
    num_blocks: int
    num_free_blocks: int  # unreferenced, no cached prefix
    num_cached_blocks: int  # unreferenced, findable in the prefix cache
    num_used_blocks: int  # referenced by live requests
    num_live_requests: int
    worker_incarnation_id: str
