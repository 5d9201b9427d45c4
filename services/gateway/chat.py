"""POST /v1/chat/completions: messages through the chat template, streamed (SSE) or whole."""

from __future__ import annotations

import time

from fastapi.responses import JSONResponse
from starlette.requests import Request

from services.gateway.errors import OpenAIError
from services.gateway.generation import ChoiceDelta
from services.gateway.logprobs_format import chat_logprobs
from services.gateway.protocol import ChatCompletionRequest, ChatTemplateFields
from services.gateway.sampling import MAX_LOGPROBS, RequestShape
from services.gateway.serving import Serving
from services.gateway.streaming import (
    StallGuardedStream,
    collect_until_disconnect,
    first_delta_or_error,
    replica_header,
    run_choices,
    sse_events,
    usage_of,
)
from services.gateway.tokenizer import ChatTemplateArgs

ENDPOINT = "chat"


def _num_logprobs(body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    if body.top_logprobs is not None and not 0 <= body.top_logprobs <= MAX_LOGPROBS:
        raise OpenAIError(400, f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {body.top_logprobs}",
                          param="top_logprobs")
    return (body.top_logprobs or 0) if body.logprobs else None


def template_args(body: ChatTemplateFields, serving: Serving) -> ChatTemplateArgs:
    """The request's chat-template fields; its own template only where the server trusts request templates."""
    if body.chat_template is not None and not serving.config.trust_request_chat_template:
        raise OpenAIError(400, "this server does not take a chat_template in requests: start it with "
                               "--trust-request-chat-template to allow them", param="chat_template")
    return ChatTemplateArgs(body.chat_template, dict(body.chat_template_kwargs or {}), body.add_generation_prompt,
                            body.continue_final_message)


async def create_chat_completion(body: ChatCompletionRequest, serving: Serving, request: Request, req_id: str):
    model = serving.require_model(body.model)
    prompt_ids = await serving.encode_chat([{"role": m.role, "content": m.text()} for m in body.messages],
                                           template_args(body, serving))
    use_new_name = body.max_completion_tokens is not None
    shape = RequestShape("messages", "max_completion_tokens" if use_new_name else "max_tokens", "top_logprobs")
    jobs = serving.build_jobs(body, [prompt_ids], req_id, body.max_completion_tokens if use_new_name
                              else body.max_tokens, _num_logprobs(body), shape)
    response_id, created = f"chatcmpl-{req_id}", int(time.time())
    base = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model.model_name}
    if body.stream:
        extra = {"usage": None} if body.include_usage else {}

        def to_chunk(delta: ChoiceDelta) -> dict:
            logprobs = chat_logprobs(serving.tokenizer, delta.logprobs) if body.logprobs else None
            choice = {"index": delta.index, "delta": {"content": delta.text} if delta.text else {},
                      "logprobs": logprobs, "finish_reason": delta.finish_reason}
            return {**base, "choices": [choice], **extra}

        head = [{**base, "choices": [{"index": job.index, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}], **extra} for job in jobs]
        usage_chunk = (lambda usage: {**base, "choices": [], "usage": usage}) if body.include_usage else None
        served_by: list[str] = []
        stream = await first_delta_or_error(request, run_choices(serving, jobs, ENDPOINT, req_id, served_by),
                                            serving.admission)
        events = sse_events(stream.deltas, head, to_chunk, usage_chunk, req_id)
        return StallGuardedStream(events, stream, req_id, serving.config.stream_stall_timeout_s,
                                  replica_header(served_by))
    served_by = []
    results = await collect_until_disconnect(request, serving, jobs, ENDPOINT, req_id, served_by)
    choices = [{"index": r.index, "message": {"role": "assistant", "content": r.text},
                "logprobs": chat_logprobs(serving.tokenizer, r.logprobs) if body.logprobs else None,
                "finish_reason": r.finish_reason} for r in results]
    return JSONResponse({"id": response_id, "object": "chat.completion", "created": created,
                         "model": model.model_name, "choices": choices, "usage": usage_of(results)},
                        headers={"X-Request-Id": req_id, **replica_header(served_by)})
