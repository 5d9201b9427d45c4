"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API served by the chat path.

A request becomes the chat completion that answers it (responses_input.py), whose answer (whole, or as a stream of
chunks) builds the Response (responses_output.py, responses_stream.py). So the chat template, tool parsing,
structured outputs, reasoning parser, admission, drain and stall guard are the chat endpoint's, unchanged. A
response with `store` (the default) is kept with its conversation (response_store.py) for GET, DELETE and the
next turn's `previous_response_id`.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request

from pagedserve.services.gateway.api.chat import create_chat_completion
from pagedserve.services.gateway.api.request_run import REPLICA_HEADER
from pagedserve.services.gateway.api.response_store import ResponseStore, StoredResponse
from pagedserve.services.gateway.api.responses_input import chat_request, input_items, responses_param
from pagedserve.services.gateway.api.responses_output import ResponseBuilder, ResponseHead, build_whole, new_id
from pagedserve.services.gateway.api.responses_protocol import InputItem, ResponsesRequest
from pagedserve.services.gateway.api.responses_stream import response_events
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.http.errors import OpenAIError

_ITEMS = TypeAdapter(list[InputItem])


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", param="response_id",
                       code="response_not_found")


async def _history(store: ResponseStore, previous_id: str | None) -> list[dict]:
    """The stored conversation a request continues (none without previous_response_id); 404 for an unknown id."""
    if previous_id is None:
        return []
    previous = await store.get(previous_id)
    if previous is None:
        raise OpenAIError(404, f"Previous response with id '{previous_id}' not found.",
                          param="previous_response_id", code="previous_response_not_found")
    return previous.conversation()


def _head(body: ResponsesRequest, model_name: str) -> ResponseHead:
    text_format = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format \
        else None
    return ResponseHead(new_id("resp"), model_name, body.instructions, body.previous_response_id, body.tools or [],
                        body.tool_choice or "auto", body.parallel_tool_calls is not False, body.temperature,
                        body.top_p, body.max_output_tokens, text_format, body.metadata, body.store is not False)


async def create_response(body: ResponsesRequest, serving: Serving, store: ResponseStore, request: Request,
                          req_id: str):
    model = serving.require_model(body.model)
    history = await _history(store, body.previous_response_id)
    try:
        past_items = _ITEMS.validate_python(history)
    except ValidationError as exc:  # a stored item this server no longer reads
        raise OpenAIError(400, f"the previous response's items cannot be read: {exc.errors()[0]['msg']}",
                          param="previous_response_id") from None
    chat_body = chat_request(body, past_items)
    try:
        answer = await create_chat_completion(chat_body, serving, request, req_id)
    except OpenAIError as exc:  # name the field as this request spells it
        exc.param = responses_param(exc.param)
        raise
    builder = ResponseBuilder(_head(body, model.model_name))
    conversation = history + [item.model_dump(by_alias=True, exclude_none=True) for item in input_items(body)]

    async def keep(response: dict) -> None:
        if body.store is not False:
            await store.put(StoredResponse(conversation, response))

    if body.stream:
        answer.body_iterator = response_events(answer.body_iterator, builder, keep)
        return answer
    response = build_whole(builder, json.loads(answer.body))
    await keep(response)
    headers = {name: answer.headers[name] for name in ("X-Request-Id", REPLICA_HEADER) if name in answer.headers}
    return JSONResponse(response, headers=headers)


def add_responses_routes(app: FastAPI, serving: Serving, request_id: Callable[[Request], str]) -> None:
    store = serving.response_store

    @app.post("/v1/responses")
    async def create(body: ResponsesRequest, request: Request):
        return await create_response(body, serving, store, request, request_id(request))

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str):
        stored = await store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        return stored.response

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str):
        if not await store.delete(response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
