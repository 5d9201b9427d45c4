from pagedserve.services.proto_gen import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_HANDOFF: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_HANDOFF: FinishReason

class GenerateRequest(_message.Message):
    __slots__ = ("req_id", "prompt_token_ids", "sampling", "cache_salt", "priority", "tenant", "tenant_weight", "resumed_output_token_ids", "tenant_kv_cache_share")
    REQ_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANT_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RESUMED_OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_KV_CACHE_SHARE_FIELD_NUMBER: _ClassVar[int]
    req_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    cache_salt: str
    priority: int
    tenant: str
    tenant_weight: float
    resumed_output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    tenant_kv_cache_share: float
    def __init__(self, req_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., cache_salt: _Optional[str] = ..., priority: _Optional[int] = ..., tenant: _Optional[str] = ..., tenant_weight: _Optional[float] = ..., resumed_output_token_ids: _Optional[_Iterable[int]] = ..., tenant_kv_cache_share: _Optional[float] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason", "num_prompt_tokens", "num_cached_tokens", "num_output_tokens", "prompt_logprobs", "has_prompt_logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    HAS_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    has_prompt_logprobs: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., num_prompt_tokens: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., num_output_tokens: _Optional[int] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., has_prompt_logprobs: _Optional[bool] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerStats(_message.Message):
    __slots__ = ("num_running", "num_waiting", "kv_usage", "num_steps", "num_preemptions", "num_scheduled_tokens_total", "num_finished", "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_evictions", "num_kv_blocks", "num_state_writes", "num_state_writes_dropped", "state_store_connected", "num_prefix_deferrals", "num_prompt_tokens_total", "num_generation_tokens_total", "worker_step_ns_total", "worker_sample_ns_total", "worker_idle_ns_total", "kv_blocks_by_tenant")
    class NumFinishedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class KvBlocksByTenantEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_STATE_WRITES_FIELD_NUMBER: _ClassVar[int]
    NUM_STATE_WRITES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    STATE_STORE_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_DEFERRALS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATION_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKER_STEP_NS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKER_SAMPLE_NS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDLE_NS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_BY_TENANT_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    kv_usage: float
    num_steps: int
    num_preemptions: int
    num_scheduled_tokens_total: int
    num_finished: _containers.ScalarMap[str, int]
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_evictions: int
    num_kv_blocks: int
    num_state_writes: int
    num_state_writes_dropped: int
    state_store_connected: bool
    num_prefix_deferrals: int
    num_prompt_tokens_total: int
    num_generation_tokens_total: int
    worker_step_ns_total: int
    worker_sample_ns_total: int
    worker_idle_ns_total: int
    kv_blocks_by_tenant: _containers.ScalarMap[str, int]
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_usage: _Optional[float] = ..., num_steps: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_scheduled_tokens_total: _Optional[int] = ..., num_finished: _Optional[_Mapping[str, int]] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ..., prefix_cache_evictions: _Optional[int] = ..., num_kv_blocks: _Optional[int] = ..., num_state_writes: _Optional[int] = ..., num_state_writes_dropped: _Optional[int] = ..., state_store_connected: _Optional[bool] = ..., num_prefix_deferrals: _Optional[int] = ..., num_prompt_tokens_total: _Optional[int] = ..., num_generation_tokens_total: _Optional[int] = ..., worker_step_ns_total: _Optional[int] = ..., worker_sample_ns_total: _Optional[int] = ..., worker_idle_ns_total: _Optional[int] = ..., kv_blocks_by_tenant: _Optional[_Mapping[str, int]] = ...) -> None: ...

class IdentifyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SchedulerIdentity(_message.Message):
    __slots__ = ("instance_id", "publishes_prefix_blocks")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISHES_PREFIX_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    publishes_prefix_blocks: bool
    def __init__(self, instance_id: _Optional[str] = ..., publishes_prefix_blocks: _Optional[bool] = ...) -> None: ...

class CheckIntegrityRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IntegrityReport(_message.Message):
    __slots__ = ("ok", "problem", "num_blocks", "num_free_blocks", "num_cached_blocks", "num_used_blocks", "num_live_requests", "worker_incarnation_id")
    OK_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_LIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    problem: str
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    num_live_requests: int
    worker_incarnation_id: str
    def __init__(self, ok: _Optional[bool] = ..., problem: _Optional[str] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_cached_blocks: _Optional[int] = ..., num_used_blocks: _Optional[int] = ..., num_live_requests: _Optional[int] = ..., worker_incarnation_id: _Optional[str] = ...) -> None: ...
