"""gateway -> scheduler contract: GenerateRequest / RequestOutput / SchedulerStats <-> their messages."""

from __future__ import annotations

from typing import Any

from pagedserve.services.proto_convert.common import logprobs_from_pb, logprobs_to_pb, sampling_from_pb, sampling_to_pb
from pagedserve.services.proto_gen import scheduler_pb2
from pagedserve.shared.integrity_report import IntegrityReport
from pagedserve.shared.request_io import FinishReason, GenerateRequest, RequestOutput
from pagedserve.shared.scheduler_stats import DICT_FIELDS, SCALAR_FIELDS, SchedulerStats
from pagedserve.shared.step_protocol import TokenLogprobs

_REASON_TO_PB = {
    None: scheduler_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: scheduler_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: scheduler_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: scheduler_pb2.FINISH_REASON_ABORT,
    FinishReason.HANDOFF: scheduler_pb2.FINISH_REASON_HANDOFF,
}
_REASON_FROM_PB = {pb: reason for reason, pb in _REASON_TO_PB.items()}


def generate_request_to_pb(request: GenerateRequest) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(req_id=request.req_id, prompt_token_ids=request.prompt_token_ids,
                                         sampling=sampling_to_pb(request.sampling), cache_salt=request.cache_salt,
                                         priority=request.priority, tenant=request.tenant,
                                         tenant_weight=request.tenant_weight,
                                         tenant_kv_cache_share=request.tenant_kv_cache_share or 0.0,
                                         resumed_output_token_ids=request.resumed_output_token_ids)


def generate_request_from_pb(pb: scheduler_pb2.GenerateRequest) -> GenerateRequest:
    """Raises SamplingParamsError for out-of-range sampling values (the servicer maps it to INVALID_ARGUMENT)."""
    return GenerateRequest(req_id=pb.req_id, prompt_token_ids=list(pb.prompt_token_ids),
                           sampling=sampling_from_pb(pb.sampling),
                           cache_salt=pb.cache_salt if pb.HasField("cache_salt") else None,
                           priority=pb.priority, tenant=pb.tenant, tenant_weight=pb.tenant_weight or 1.0,
                           tenant_kv_cache_share=pb.tenant_kv_cache_share or None,
                           resumed_output_token_ids=list(pb.resumed_output_token_ids))


def output_to_chunk(output: RequestOutput) -> scheduler_pb2.GenerateChunk:
    logprobs = [logprobs_to_pb(lp) for lp in output.new_logprobs if lp is not None]
    prompt = output.prompt_logprobs
    return scheduler_pb2.GenerateChunk(
        token_ids=output.new_token_ids, logprobs=logprobs if len(logprobs) == len(output.new_token_ids) else [],
        finish_reason=_REASON_TO_PB[output.finish_reason], num_prompt_tokens=output.num_prompt_tokens,
        num_cached_tokens=output.num_cached_tokens, num_output_tokens=output.num_output_tokens,
        prompt_logprobs=[logprobs_to_pb(lp) for lp in prompt or []], has_prompt_logprobs=prompt is not None)


def output_from_chunk(req_id: str, chunk: scheduler_pb2.GenerateChunk) -> RequestOutput:
    token_ids = list(chunk.token_ids)
    logprobs: list[TokenLogprobs | None] = [None] * len(token_ids)
    if len(chunk.logprobs) == len(token_ids):
        logprobs = [logprobs_from_pb(lp) for lp in chunk.logprobs]
    return RequestOutput(req_id=req_id, new_token_ids=token_ids, new_logprobs=logprobs,
                         finish_reason=_REASON_FROM_PB[chunk.finish_reason],
                         num_prompt_tokens=chunk.num_prompt_tokens, num_cached_tokens=chunk.num_cached_tokens,
                         num_output_tokens=chunk.num_output_tokens,
                         prompt_logprobs=[logprobs_from_pb(lp) for lp in chunk.prompt_logprobs]
                         if chunk.has_prompt_logprobs else None)


def stats_to_pb(stats: SchedulerStats) -> scheduler_pb2.SchedulerStats:
    """Field by field, by name: the message and the dataclass have the same fields (a unit test holds them so)."""
    return scheduler_pb2.SchedulerStats(**{name: getattr(stats, name) for name in SCALAR_FIELDS},
                                        **{name: getattr(stats, name) for name in DICT_FIELDS})


def stats_from_pb(pb: scheduler_pb2.SchedulerStats) -> SchedulerStats:
    values: dict[str, Any] = {name: getattr(pb, name) for name in SCALAR_FIELDS}
    values.update({name: dict(getattr(pb, name)) for name in DICT_FIELDS})
    return SchedulerStats(**values)

_INTEGRITY_FIELDS = ("ok", "problem", "num_blocks", "num_free_blocks", "num_cached_blocks", "num_used_blocks",
                     "num_live_requests", "worker_incarnation_id")


def integrity_to_pb(report: IntegrityReport) -> scheduler_pb2.IntegrityReport:
    return scheduler_pb2.IntegrityReport(**{name: getattr(report, name) for name in _INTEGRITY_FIELDS})


def integrity_from_pb(pb: scheduler_pb2.IntegrityReport) -> IntegrityReport:
    return IntegrityReport(**{name: getattr(pb, name) for name in _INTEGRITY_FIELDS})
