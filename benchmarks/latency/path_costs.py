"""CPU cost per token of the Python on a stream's path outside the forward pass, timed in process.

- gateway: incremental detokenization, the stop-string matcher and one SSE chunk (JSON) per token;
- scheduler -> gateway: one GenerateChunk built, serialized, parsed and turned back into a RequestOutput;
- scheduler <-> worker: one decode step's StepRequest and StepReply, both ways.
The gRPC transport itself (HTTP/2 framing, the event loops, thread hand-offs) is not in these; the breakdown's
per-process CPU and the worker's wait between steps carry it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

from pagedserve.services.gateway.text.detokenizer import IncrementalDetokenizer
from pagedserve.services.gateway.text.stop_strings import StopStringMatcher
from pagedserve.services.proto_convert.scheduler_contract import output_from_chunk, output_to_chunk
from pagedserve.services.proto_convert.worker_contract import (
    step_input_from_pb,
    step_input_to_pb,
    step_output_from_pb,
    step_output_to_pb,
)
from pagedserve.services.proto_gen import scheduler_pb2, worker_pb2
from pagedserve.shared.request_io import RequestOutput
from pagedserve.shared.step_protocol import CachedRequest, StepInput, StepOutput


def _per_call_us(fn: Callable[[int], None], num_calls: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time of fn(i) for i in range(num_calls), in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(num_calls):
            fn(i)
        times.append((time.perf_counter() - start) / num_calls * 1e6)
    return statistics.median(times)


def gateway_us(tokenizer, token_ids: list[int]) -> float:
    """Detokenize + stop strings + SSE chunk, per token of `token_ids` (a real answer)."""
    def run_all() -> None:
        detokenizer, stops = IncrementalDetokenizer(tokenizer, token_ids[:4]), StopStringMatcher(["\n\nUser:"])
        for token_id in token_ids:
            text = stops.feed(detokenizer.add([token_id]))
            chunk = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
            f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()

    return _per_call_us(lambda _: run_all(), 1) / len(token_ids)


def chunk_us() -> float:
    output = RequestOutput("r1", [1234], [None], None, 40, 0, 17)

    def round_trip(_: int) -> None:
        output_from_chunk("r1", scheduler_pb2.GenerateChunk.FromString(output_to_chunk(output).SerializeToString()))

    return _per_call_us(round_trip, 2000)


def step_us() -> float:
    step = StepInput(cached_requests=[CachedRequest("r1", [], 57)], num_scheduled_tokens={"r1": 1})
    output = StepOutput(req_ids=["r1"], sampled_token_ids=[1234], logprobs=[None], forward_time_ns=9_000_000)

    def round_trip(i: int) -> None:
        step_input_from_pb(worker_pb2.StepRequest.FromString(step_input_to_pb(step, i).SerializeToString()))
        step_output_from_pb(worker_pb2.StepReply.FromString(step_output_to_pb(output).SerializeToString()))

    return _per_call_us(round_trip, 2000)


def path_costs(tokenizer, token_ids: list[int]) -> dict[str, float]:
    return {"gateway_detokenize_stop_sse_us": gateway_us(tokenizer, token_ids),
            "generate_chunk_proto_us": chunk_us(), "step_request_reply_proto_us": step_us()}
