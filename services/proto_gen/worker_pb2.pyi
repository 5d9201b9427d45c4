from pagedserve.services.proto_gen import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrepareGrammarRequest(_message.Message):
    __slots__ = ("structured_output",)
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    structured_output: _common_pb2.StructuredOutput
    def __init__(self, structured_output: _Optional[_Union[_common_pb2.StructuredOutput, _Mapping]] = ...) -> None: ...

class PrepareGrammarReply(_message.Message):
    __slots__ = ("compile_time_ns",)
    COMPILE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    compile_time_ns: int
    def __init__(self, compile_time_ns: _Optional[int] = ...) -> None: ...

class NewRequest(_message.Message):
    __slots__ = ("req_id", "token_ids", "num_prompt_tokens", "sampling", "block_ids", "num_computed_tokens", "traceparent")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_prompt_tokens: int
    sampling: _common_pb2.SamplingParams
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    traceparent: str
    def __init__(self, req_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_prompt_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CachedRequest(_message.Message):
    __slots__ = ("req_id", "new_block_ids", "num_computed_tokens")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    new_block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_computed_tokens: int
    def __init__(self, req_id: _Optional[str] = ..., new_block_ids: _Optional[_Iterable[int]] = ..., num_computed_tokens: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("new_requests", "cached_requests", "scheduled_req_ids", "num_scheduled_tokens", "finished_req_ids", "step_id", "incarnation_id", "traceparent", "draft_tokens", "draft_model_slots")
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_REQ_IDS_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    cached_requests: _containers.RepeatedCompositeFieldContainer[CachedRequest]
    scheduled_req_ids: _containers.RepeatedScalarFieldContainer[str]
    num_scheduled_tokens: _containers.RepeatedScalarFieldContainer[int]
    finished_req_ids: _containers.RepeatedScalarFieldContainer[str]
    step_id: int
    incarnation_id: str
    traceparent: str
    draft_tokens: _containers.RepeatedCompositeFieldContainer[DraftTokens]
    draft_model_slots: _containers.RepeatedCompositeFieldContainer[DraftModelSlots]
    def __init__(self, new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., cached_requests: _Optional[_Iterable[_Union[CachedRequest, _Mapping]]] = ..., scheduled_req_ids: _Optional[_Iterable[str]] = ..., num_scheduled_tokens: _Optional[_Iterable[int]] = ..., finished_req_ids: _Optional[_Iterable[str]] = ..., step_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., traceparent: _Optional[str] = ..., draft_tokens: _Optional[_Iterable[_Union[DraftTokens, _Mapping]]] = ..., draft_model_slots: _Optional[_Iterable[_Union[DraftModelSlots, _Mapping]]] = ...) -> None: ...

class DraftModelSlots(_message.Message):
    __slots__ = ("req_id", "num_slots")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    num_slots: int
    def __init__(self, req_id: _Optional[str] = ..., num_slots: _Optional[int] = ...) -> None: ...

class DraftTokens(_message.Message):
    __slots__ = ("req_id", "token_ids")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, req_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AcceptedDrafts(_message.Message):
    __slots__ = ("req_id", "num_accepted")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    num_accepted: int
    def __init__(self, req_id: _Optional[str] = ..., num_accepted: _Optional[int] = ...) -> None: ...

class PromptLogprobs(_message.Message):
    __slots__ = ("req_id", "logprobs")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, req_id: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("req_id", "token_id", "logprobs")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    token_id: int
    logprobs: _common_pb2.TokenLogprobs
    def __init__(self, req_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprobs: _Optional[_Union[_common_pb2.TokenLogprobs, _Mapping]] = ...) -> None: ...

class FailedRequest(_message.Message):
    __slots__ = ("req_id", "message", "invalid_argument")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INVALID_ARGUMENT_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    message: str
    invalid_argument: bool
    def __init__(self, req_id: _Optional[str] = ..., message: _Optional[str] = ..., invalid_argument: _Optional[bool] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("sampled", "forward_time_ns", "sample_time_ns", "idle_time_ns", "incarnation_id", "failed", "accepted_drafts", "prompt_logprobs")
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    sampled: _containers.RepeatedCompositeFieldContainer[SampledToken]
    forward_time_ns: int
    sample_time_ns: int
    idle_time_ns: int
    incarnation_id: str
    failed: _containers.RepeatedCompositeFieldContainer[FailedRequest]
    accepted_drafts: _containers.RepeatedCompositeFieldContainer[AcceptedDrafts]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[PromptLogprobs]
    def __init__(self, sampled: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., forward_time_ns: _Optional[int] = ..., sample_time_ns: _Optional[int] = ..., idle_time_ns: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., failed: _Optional[_Iterable[_Union[FailedRequest, _Mapping]]] = ..., accepted_drafts: _Optional[_Iterable[_Union[AcceptedDrafts, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[PromptLogprobs, _Mapping]]] = ...) -> None: ...
