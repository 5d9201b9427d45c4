"""gateway -> scheduler contract: GenerateRequest / RequestOutput / ServiceStats <-> their messages."""

from __future__ import annotations

from services.proto_convert.common import logprobs_from_pb, logprobs_to_pb, sampling_from_pb, sampling_to_pb
from services.proto_gen import scheduler_pb2
from services.scheduler.service_stats import ServiceStats
from shared.request_io import FinishReason, GenerateRequest, RequestOutput

_REASON_TO_PB = {
    None: scheduler_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: scheduler_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: scheduler_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: scheduler_pb2.FINISH_REASON_ABORT,
}
_REASON_FROM_PB = {pb: reason for reason, pb in _REASON_TO_PB.items()}


def generate_request_to_pb(request: GenerateRequest) -> scheduler_pb2.GenerateRequest:
    return scheduler_pb2.GenerateRequest(req_id=request.req_id, prompt_token_ids=request.prompt_token_ids,
                                         sampling=sampling_to_pb(request.sampling), cache_salt=request.cache_salt)


def generate_request_from_pb(pb: scheduler_pb2.GenerateRequest) -> GenerateRequest:
    """Raises SamplingParamsError for out-of-range sampling values (the servicer maps it to INVALID_ARGUMENT)."""
    return GenerateRequest(req_id=pb.req_id, prompt_token_ids=list(pb.prompt_token_ids),
                           sampling=sampling_from_pb(pb.sampling),
                           cache_salt=pb.cache_salt if pb.HasField("cache_salt") else None)


def output_to_chunk(output: RequestOutput) -> scheduler_pb2.GenerateChunk:
    logprobs = [logprobs_to_pb(lp) for lp in output.new_logprobs if lp is not None]
    return scheduler_pb2.GenerateChunk(
        token_ids=output.new_token_ids, logprobs=logprobs if len(logprobs) == len(output.new_token_ids) else [],
        finish_reason=_REASON_TO_PB[output.finish_reason], num_prompt_tokens=output.num_prompt_tokens,
        num_cached_tokens=output.num_cached_tokens, num_output_tokens=output.num_output_tokens)


def output_from_chunk(req_id: str, chunk: scheduler_pb2.GenerateChunk) -> RequestOutput:
    token_ids = list(chunk.token_ids)
    logprobs = ([logprobs_from_pb(lp) for lp in chunk.logprobs] if len(chunk.logprobs) == len(token_ids)
                else [None] * len(token_ids))
    return RequestOutput(req_id=req_id, new_token_ids=token_ids, new_logprobs=logprobs,
                         finish_reason=_REASON_FROM_PB[chunk.finish_reason],
                         num_prompt_tokens=chunk.num_prompt_tokens, num_cached_tokens=chunk.num_cached_tokens,
                         num_output_tokens=chunk.num_output_tokens)


_STATS_SCALARS = ("num_running", "num_waiting", "kv_usage", "num_steps", "num_preemptions",
                  "num_scheduled_tokens_total", "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_evictions",
                  "num_kv_blocks", "num_state_writes", "num_state_writes_dropped", "state_store_connected",
                  "num_prefix_deferrals")


def stats_to_pb(stats: ServiceStats) -> scheduler_pb2.SchedulerStats:
    return scheduler_pb2.SchedulerStats(**{name: getattr(stats, name) for name in _STATS_SCALARS},
                                        num_finished=stats.num_finished)


def stats_from_pb(pb: scheduler_pb2.SchedulerStats) -> ServiceStats:
    return ServiceStats(**{name: getattr(pb, name) for name in _STATS_SCALARS}, num_finished=dict(pb.num_finished))
