"""Converters for the messages both contracts share: sampling parameters, logprobs, model description."""

from __future__ import annotations

from pagedserve.services.proto_gen import common_pb2
from pagedserve.shared.sampling_params import SamplingParams, SamplingParamsError
from pagedserve.shared.step_protocol import ModelDescription, TokenLogprobs
from pagedserve.shared.structured_output import StructuredOutput, StructuredOutputKind

# Scalars copied one to one; an unset proto field falls back to the dataclass default.
_SAMPLING_SCALARS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
                     "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "ignore_eos",
                     "prompt_logprobs")


_KIND_TO_PB = {kind: common_pb2.StructuredOutputKind.Value(f"STRUCTURED_OUTPUT_KIND_{kind.name}")
               for kind in StructuredOutputKind}
_KIND_FROM_PB = {pb: kind for kind, pb in _KIND_TO_PB.items()}


def sampling_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    scalars = {name: getattr(params, name) for name in _SAMPLING_SCALARS if getattr(params, name) is not None}
    structured = params.structured_output
    return common_pb2.SamplingParams(
        **scalars, logit_bias=params.logit_bias, stop_token_ids=list(params.stop_token_ids),
        structured_output=structured_output_to_pb(structured) if structured is not None else None)


def sampling_from_pb(pb: common_pb2.SamplingParams) -> SamplingParams:
    """Raises SamplingParamsError (with .param) for out-of-range values."""
    scalars = {name: getattr(pb, name) for name in _SAMPLING_SCALARS if pb.HasField(name)}
    structured = structured_output_from_pb(pb.structured_output) if pb.HasField("structured_output") else None
    return SamplingParams(**scalars, logit_bias=dict(pb.logit_bias), stop_token_ids=tuple(pb.stop_token_ids),
                          structured_output=structured)


def structured_output_to_pb(structured: StructuredOutput) -> common_pb2.StructuredOutput:
    return common_pb2.StructuredOutput(kind=_KIND_TO_PB[structured.kind], spec=structured.spec,
                                       any_whitespace=structured.any_whitespace)


def structured_output_from_pb(pb: common_pb2.StructuredOutput) -> StructuredOutput:
    """Raises SamplingParamsError for a kind this side does not know (a newer peer)."""
    kind = _KIND_FROM_PB.get(pb.kind)
    if kind is None:
        raise SamplingParamsError(f"unknown structured output kind {pb.kind}", "structured_output")
    return StructuredOutput(kind, pb.spec, pb.any_whitespace)


def logprobs_to_pb(lp: TokenLogprobs) -> common_pb2.TokenLogprobs:
    return common_pb2.TokenLogprobs(token_id=lp.token_id, logprob=lp.logprob, rank=lp.rank,
                                    top_token_ids=lp.top_token_ids, top_logprobs=lp.top_logprobs)


def logprobs_from_pb(pb: common_pb2.TokenLogprobs) -> TokenLogprobs:
    return TokenLogprobs(token_id=pb.token_id, logprob=pb.logprob, rank=pb.rank,
                         top_token_ids=list(pb.top_token_ids), top_logprobs=list(pb.top_logprobs))


def description_to_pb(desc: ModelDescription) -> common_pb2.ModelDescription:
    return common_pb2.ModelDescription(
        model_name=desc.model_name, architecture=desc.architecture, max_model_len=desc.max_model_len,
        vocab_size=desc.vocab_size, num_kv_blocks=desc.num_kv_blocks, block_size=desc.block_size,
        eos_token_ids=list(desc.eos_token_ids), dtype=desc.dtype, device=desc.device,
        attention_backend=desc.attention_backend, kv_cache_bytes=desc.kv_cache_bytes,
        incarnation_id=desc.incarnation_id)


def description_from_pb(pb: common_pb2.ModelDescription) -> ModelDescription:
    return ModelDescription(
        model_name=pb.model_name, architecture=pb.architecture, max_model_len=pb.max_model_len,
        vocab_size=pb.vocab_size, num_kv_blocks=pb.num_kv_blocks, block_size=pb.block_size,
        eos_token_ids=tuple(pb.eos_token_ids), dtype=pb.dtype, device=pb.device,
        attention_backend=pb.attention_backend, kv_cache_bytes=pb.kv_cache_bytes,
        incarnation_id=pb.incarnation_id)
