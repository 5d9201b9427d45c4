"""The Response builder on chat answers the fake scheduler cannot give: reasoning (from a reasoning parser), text
after a call, a failed stream; and the in-memory store's bounds."""

from __future__ import annotations

import asyncio

from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from pagedserve.services.gateway.api.response_store import MemoryResponseStore, StoredResponse
from pagedserve.services.gateway.api.responses_output import ResponseBuilder, ResponseHead, build_whole
from pagedserve.services.gateway.api.responses_stream import EventNumbering, chunk_events, response_events

EVENTS = TypeAdapter(ResponseStreamEvent)
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12, "prompt_tokens_details": {"cached_tokens": 2},
         "completion_tokens_details": {"reasoning_tokens": 3}}


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_reasoning_content_becomes_a_reasoning_item_whole_and_streamed():
    completion = {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris."}}],
        "usage": USAGE}
    whole = Response.model_validate(build_whole(ResponseBuilder(ResponseHead("resp_1", "m")), completion))
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].text == "France's capital is Paris." and whole.output_text == "Paris."
    assert whole.usage.output_tokens_details.reasoning_tokens == 3
    assert whole.usage.input_tokens_details.cached_tokens == 2

    builder, numbering = ResponseBuilder(ResponseHead("resp_2", "m")), EventNumbering()
    events = builder.start()
    for piece in ({"reasoning_content": "France's capital "}, {"reasoning_content": "is Paris."},
                  {"content": "Par"}, {"content": "is."}):
        events += chunk_events(builder, chunk(piece))
    events += chunk_events(builder, chunk({}, "stop")) + chunk_events(builder, {"choices": [], "usage": USAGE})
    for event in events:
        numbering.sse(event)
        EVENTS.validate_python(event)
    types = [e["type"] for e in events]
    assert types.count("response.reasoning_text.delta") == 2 and types.count("response.output_text.delta") == 2
    assert types.index("response.reasoning_text.done") < types.index("response.content_part.added")
    streamed = events[-1]["response"]
    assert [i["type"] for i in streamed["output"]] == ["reasoning", "message"]
    assert streamed["output"][0]["content"] == [{"type": "reasoning_text", "text": "France's capital is Paris."}]
    assert streamed["usage"] == whole.usage.model_dump(exclude_none=True)


def test_text_after_a_call_opens_a_second_message():
    builder = ResponseBuilder(ResponseHead("resp_3", "m"))
    events = builder.text("Let me check.") + builder.call_start(0, "call_1", "f") + builder.call_arguments(0, "{}")
    events += builder.text("Done.") + builder.finish("stop") + [builder.complete(USAGE)]
    for event in events:
        event["sequence_number"] = 0
        EVENTS.validate_python(event)
    response = Response.model_validate(events[-1]["response"])
    assert [item.type for item in response.output] == ["message", "function_call", "message"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]


def test_an_error_event_of_the_chat_stream_fails_the_response():
    async def frames():
        yield 'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}\n\n'
        yield 'data: {"error": {"message": "the worker was lost", "type": "server_error"}}\n\n'
        yield "data: [DONE]\n\n"

    stored: list[dict] = []

    async def keep(response: dict) -> None:
        stored.append(response)

    async def run() -> list[str]:
        return [frame async for frame in response_events(frames(), ResponseBuilder(ResponseHead("r", "m")), keep)]

    out = asyncio.run(run())
    last = EVENTS.validate_json(out[-1].split("data: ", 1)[1])
    assert last.type == "response.failed" and last.response.error.message == "the worker was lost"
    assert last.response.status == "failed" and not stored


def test_memory_store_is_bounded_in_bytes_and_time():
    def record(i: int, size: int) -> StoredResponse:
        return StoredResponse([{"type": "message", "role": "user", "content": "x" * size}],
                              {"id": f"resp_{i}", "output": []})

    async def run() -> None:
        size = len(record(0, 300).to_json())
        store = MemoryResponseStore(ttl_s=3600, max_bytes=3 * size)  # room for three records
        for i in range(5):
            await store.put(record(i, 300))
            await store.get("resp_0")  # kept in use: the least recently used others go first
        assert store.num_bytes == 3 * size
        assert [await store.get(f"resp_{i}") is not None for i in range(5)] == [True, False, False, True, True]
        await store.put(record(9, 5000))  # larger than the whole store: not kept, nothing else dropped
        assert await store.get("resp_9") is None and await store.get("resp_4") is not None
        assert await store.delete("resp_4") and not await store.delete("resp_4")
        expiring = MemoryResponseStore(ttl_s=0.01, max_bytes=1000)
        await expiring.put(record(1, 10))
        await asyncio.sleep(0.05)
        assert await expiring.get("resp_1") is None and expiring.num_bytes == 0

    asyncio.run(run())
