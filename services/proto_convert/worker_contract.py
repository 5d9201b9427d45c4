"""scheduler -> worker contract: StepInput / StepOutput <-> StepRequest / StepReply."""

from __future__ import annotations

from collections.abc import Mapping

from pagedserve.services.proto_convert.common import logprobs_from_pb, logprobs_to_pb, sampling_from_pb, sampling_to_pb
from pagedserve.services.proto_gen import worker_pb2
from pagedserve.shared.step_protocol import CachedRequest, FailedRequest, NewRequest, StepInput, StepOutput


def step_input_to_pb(step: StepInput, step_id: int = 0, traceparents: Mapping[str, str] | None = None,
                     step_traceparent: str = "") -> worker_pb2.StepRequest:
    """`traceparents` (req_id -> W3C traceparent) lets worker spans of a new request join its trace;
    `step_traceparent` makes the worker's step span a child of the scheduler's (a traced step)."""
    traceparents = traceparents or {}
    return worker_pb2.StepRequest(
        new_requests=[worker_pb2.NewRequest(
            req_id=r.req_id, token_ids=r.token_ids, num_prompt_tokens=r.num_prompt_tokens,
            sampling=sampling_to_pb(r.sampling), block_ids=r.block_ids, num_computed_tokens=r.num_computed_tokens,
            traceparent=traceparents.get(r.req_id, "")) for r in step.new_requests],
        cached_requests=[worker_pb2.CachedRequest(
            req_id=r.req_id, new_block_ids=r.new_block_ids, num_computed_tokens=r.num_computed_tokens)
            for r in step.cached_requests],
        scheduled_req_ids=list(step.num_scheduled_tokens),
        num_scheduled_tokens=list(step.num_scheduled_tokens.values()),
        finished_req_ids=step.finished_req_ids,
        draft_tokens=[worker_pb2.DraftTokens(req_id=req_id, token_ids=drafts)
                      for req_id, drafts in step.draft_token_ids.items()],
        draft_model_slots=[worker_pb2.DraftModelSlots(req_id=req_id, num_slots=n)
                           for req_id, n in step.draft_model_slots.items()],
        step_id=step_id, incarnation_id=step.incarnation_id, traceparent=step_traceparent)


def step_input_from_pb(pb: worker_pb2.StepRequest) -> StepInput:
    return StepInput(
        new_requests=[NewRequest(
            req_id=r.req_id, token_ids=list(r.token_ids), num_prompt_tokens=r.num_prompt_tokens,
            sampling=sampling_from_pb(r.sampling), block_ids=list(r.block_ids),
            num_computed_tokens=r.num_computed_tokens) for r in pb.new_requests],
        cached_requests=[CachedRequest(req_id=r.req_id, new_block_ids=list(r.new_block_ids),
                                       num_computed_tokens=r.num_computed_tokens) for r in pb.cached_requests],
        num_scheduled_tokens=dict(zip(pb.scheduled_req_ids, pb.num_scheduled_tokens, strict=True)),
        finished_req_ids=list(pb.finished_req_ids),
        incarnation_id=pb.incarnation_id,
        draft_token_ids={d.req_id: list(d.token_ids) for d in pb.draft_tokens},
        draft_model_slots={d.req_id: d.num_slots for d in pb.draft_model_slots})


def traceparents_from_pb(pb: worker_pb2.StepRequest) -> dict[str, str]:
    return {r.req_id: r.traceparent for r in pb.new_requests if r.traceparent}


def step_output_to_pb(output: StepOutput) -> worker_pb2.StepReply:
    sampled = []
    for req_id, token_id, lp in zip(output.req_ids, output.sampled_token_ids, output.logprobs, strict=True):
        token = worker_pb2.SampledToken(req_id=req_id, token_id=token_id)
        if lp is not None:
            token.logprobs.CopyFrom(logprobs_to_pb(lp))
        sampled.append(token)
    failed = [worker_pb2.FailedRequest(req_id=f.req_id, message=f.message, invalid_argument=f.invalid_argument)
              for f in output.failed]
    return worker_pb2.StepReply(sampled=sampled, forward_time_ns=output.forward_time_ns,
                                sample_time_ns=output.sample_time_ns, idle_time_ns=output.idle_time_ns,
                                incarnation_id=output.incarnation_id, failed=failed,
                                accepted_drafts=[worker_pb2.AcceptedDrafts(req_id=req_id, num_accepted=n)
                                                 for req_id, n in output.num_accepted_drafts.items()],
                                prompt_logprobs=[worker_pb2.PromptLogprobs(
                                    req_id=req_id, logprobs=[logprobs_to_pb(lp) for lp in lps])
                                    for req_id, lps in output.prompt_logprobs.items()])


def step_output_from_pb(pb: worker_pb2.StepReply) -> StepOutput:
    return StepOutput(
        req_ids=[s.req_id for s in pb.sampled],
        sampled_token_ids=[s.token_id for s in pb.sampled],
        logprobs=[logprobs_from_pb(s.logprobs) if s.HasField("logprobs") else None for s in pb.sampled],
        forward_time_ns=pb.forward_time_ns, sample_time_ns=pb.sample_time_ns, idle_time_ns=pb.idle_time_ns,
        incarnation_id=pb.incarnation_id,
        failed=[FailedRequest(f.req_id, f.message, f.invalid_argument) for f in pb.failed],
        num_accepted_drafts={a.req_id: a.num_accepted for a in pb.accepted_drafts},
        prompt_logprobs={p.req_id: [logprobs_from_pb(lp) for lp in p.logprobs] for p in pb.prompt_logprobs})
