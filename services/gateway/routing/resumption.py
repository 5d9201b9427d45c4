"""A request that survives its replica: resumed on another live replica as a continuation.

When the replica serving a request fails (its gRPC stream breaks or ends UNAVAILABLE: the scheduler died, its
worker died, or it stopped answering and its calls were abandoned) or hands the request off (FinishReason.HANDOFF:
it is draining), the request is sent again, routed by prefix as usual but never to a replica it already left, with
the same prompt and sampling parameters (seed included) and `resumed_output_token_ids` = every token id it has
produced so far. The scheduler takes those as outputs already made, so the continuation's outputs carry only new
tokens and its `num_output_tokens` counts all of them: the caller (detokenizer, stop strings, tool and reasoning
parsers, usage) sees one stream with no token twice and none missing.

Invariants:
- Only replica-level failures are resumed (UNAVAILABLE). A request-specific error (a bad grammar, validation,
  INTERNAL for this request alone) or a refusal (RESOURCE_EXHAUSTED before output, already retried once by the
  router) goes to the caller as it is.
- At most `max_resumes` failures are resumed per request; the next one, or one with no other live replica to go
  to, goes to the caller as the original error (the client's error event, as before resumption existed).
- A HANDOFF output never reaches the caller: its tokens (if any) go on as a running output.
- Each resume is counted once it took: a `resumed` event on the current span (reason, old and new replica) and
  `pagedserve_requests_resumed_total{reason}`, when the continuation's first output arrives.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Literal

import grpc
import grpc.aio
from opentelemetry import trace

from pagedserve.services.gateway.routing.replicas import Replica
from pagedserve.services.gateway.routing.router import Router
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput

log = logging.getLogger(__name__)

ResumeReason = Literal["replica_failed", "drain"]
RESUME_REASONS: tuple[ResumeReason, ...] = ("replica_failed", "drain")
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE})  # the replica is gone or unreachable, not the request at fault


@dataclass
class ResumeBudget:
    """What a request may still spend on resumes.

    Failures count against `max_resumes`; hand-offs do not. A hand-off is the operator's planned move (a rollout or
    scale-down drains replicas one by one), not a sign that the request itself breaks replicas: a long request in a
    rolling update of R replicas may be handed off up to R - 1 times, and it would be wrong to cut it with an error
    because the fleet was updated. What a failure budget guards against, a request that keeps failing wherever it
    goes, still holds: a hand-off that brought no new token since the previous resume counts as a failure, so
    replicas that hand a request to one another without progress use up the same budget."""

    max_resumes: int
    failures: int = 0
    tokens_at_last_resume: int = -1  # tokens produced when it was last resumed (-1: never resumed)

    def allows(self, reason: ResumeReason, num_tokens: int) -> bool:
        """Spend on one more resume, if there is any left (False: give up)."""
        if reason == "drain" and num_tokens > self.tokens_at_last_resume:
            self.tokens_at_last_resume = num_tokens
            return True
        if self.failures >= self.max_resumes:
            return False
        self.failures += 1
        self.tokens_at_last_resume = num_tokens
        return True


@dataclass
class _Leg:
    """One replica's part of the request."""

    request: GenerateRequest
    called: list[Replica] = field(default_factory=list)  # the replicas the router opened calls on

    @property
    def replica(self) -> Replica | None:
        return self.called[-1] if self.called else None


class _HandedOff(Exception):
    """The replica handed the request off (it is draining)."""


async def generate_resuming(router: Router, request: GenerateRequest, served_by: list[str] | None = None
                            ) -> AsyncGenerator[RequestOutput, None]:
    """The request's outputs to the end, resumed on another replica when the one serving it fails or drains."""
    budget = ResumeBudget(router.config.max_resumes)
    produced = list(request.resumed_output_token_ids)
    left: list[Replica] = []  # replicas that failed or handed this request off
    resumed_from: tuple[ResumeReason, str] | None = None  # (reason, old replica) until the continuation's output
    while True:
        leg = _Leg(replace(request, resumed_output_token_ids=list(produced)) if produced else request)
        try:
            async with contextlib.aclosing(router.generate(leg.request, served_by, tuple(left), leg.called)) as outs:
                async for out in outs:
                    if resumed_from is not None:
                        _record_resume(router, leg.request, *resumed_from, leg.replica.name if leg.replica else "")
                        resumed_from = None
                    produced.extend(out.new_token_ids)
                    if out.finish_reason is FinishReason.HANDOFF:
                        if out.new_token_ids:
                            yield replace(out, finish_reason=None)
                        raise _HandedOff
                    yield out
            return
        except _HandedOff:
            reason: ResumeReason = "drain"
            error: Exception | None = None
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in RESUMABLE or leg.replica is None:
                raise
            reason, error = "replica_failed", exc
            router.replicas.mark_failed(leg.replica, exc.details() or exc.code().name)
        old = leg.replica
        assert old is not None
        left.append(old)
        if not budget.allows(reason, len(produced)) or not any(r not in left for r in router.replicas.live()):
            if error is not None:
                raise error
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       f"replica {old.name} is draining and no other replica can take the request")
        resumed_from = (reason, old.name)


def _record_resume(router: Router, request: GenerateRequest, reason: ResumeReason, old: str, new: str) -> None:
    num_resumed = len(request.resumed_output_token_ids)
    log.info("req_id=%s resumed on %s after %d tokens (%s on %s)", request.req_id, new, num_resumed, reason, old)
    router.metrics.resumed.labels(reason).inc()
    trace.get_current_span().add_event("resumed", {"reason": reason, "pagedserve.replica.old": old,
                                                   "pagedserve.replica.new": new,
                                                   "pagedserve.resumed_tokens": num_resumed})
