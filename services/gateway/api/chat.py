"""POST /v1/chat/completions: messages through the chat template, streamed (SSE) or whole."""

from __future__ import annotations

import time

from fastapi.responses import JSONResponse
from starlette.requests import Request

from pagedserve.services.gateway.api.client_identity import client_key
from pagedserve.services.gateway.api.generation import ChoiceDelta
from pagedserve.services.gateway.api.logprobs_format import chat_logprobs, vllm_prompt_logprobs
from pagedserve.services.gateway.api.protocol import ChatCompletionRequest, ChatTemplateFields
from pagedserve.services.gateway.api.request_fields import check_extra_fields
from pagedserve.services.gateway.api.request_run import (
    collect_until_disconnect,
    replica_header,
    stream_choices,
)
from pagedserve.services.gateway.api.sampling import MAX_LOGPROBS, RequestShape
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.api.sse_template import TextChunkTemplate, text_marker
from pagedserve.services.gateway.api.usage import usage_of
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.chat_answer import AnswerParsing, StreamedAnswers, message_of
from pagedserve.services.gateway.structured.reasoning_grammar import after_reasoning
from pagedserve.services.gateway.structured.structured_outputs import Constraint, constraint_of
from pagedserve.services.gateway.structured.tools import ToolPlan, template_messages, tool_constraint, tool_plan_of
from pagedserve.services.gateway.text.tokenizer import ChatTemplateArgs

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


def _constraint(body: ChatCompletionRequest, plan: ToolPlan | None) -> Constraint | None:
    """The answer's one grammar: from the tools (unless tool_choice is none) or from response_format & co."""
    asked = constraint_of(body)
    calls = tool_constraint(plan) if plan is not None else None
    if asked is not None and calls is not None:
        raise OpenAIError(400, f"{asked.param} cannot be combined with tools unless tool_choice is none",
                          param=asked.param)
    return asked or calls


def _with_reasoning_tokens(usage: dict, serving: Serving, reasoning_texts: list[str] | None) -> dict:
    """usage.completion_tokens_details.reasoning_tokens: the reasoning texts' tokens (re-tokenized; the think tags
    not counted)."""
    if reasoning_texts is None:
        return usage
    num = sum(len(serving.tokenizer.encode(text, add_special_tokens=False)) for text in reasoning_texts if text)
    return {**usage, "completion_tokens_details": {"reasoning_tokens": num}}


async def create_chat_completion(body: ChatCompletionRequest, serving: Serving, request: Request, req_id: str):
    model = serving.require_model(body.model)
    check_extra_fields(body)
    plan = tool_plan_of(body, serving.tool_call_parser)
    functions = [tool.function for tool in body.tools or []]
    args = template_args(body, serving)
    messages, tools = template_messages(body.messages, functions, serving.tokenizer.supports_tools(args),
                                        serving.call_format(functions))
    prompt_ids = await serving.encode_chat(messages, args, tools=tools)
    reasoning = serving.reasoning_format(args)
    constraint = after_reasoning(_constraint(body, plan), reasoning)
    use_new_name = body.max_completion_tokens is not None
    shape = RequestShape("messages", "max_completion_tokens" if use_new_name else "max_tokens", "top_logprobs")
    if body.prompt_logprobs is not None and body.stream:
        raise OpenAIError(400, "prompt_logprobs are returned in non-streamed answers only", param="stream")
    jobs = serving.build_jobs(body, [prompt_ids], req_id, body.max_completion_tokens if use_new_name
                              else body.max_tokens, _num_logprobs(body), shape, prompt_logprobs=body.prompt_logprobs)
    jobs = serving.with_grammar(jobs, await serving.check_constraint(constraint, client_key(request)))
    calls = plan if plan is not None and plan.parses_calls else None
    parsing = AnswerParsing(calls, reasoning)
    response_id, created = f"chatcmpl-{req_id}", int(time.time())
    base = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model.model_name}
    if body.stream:
        extra = {"usage": None} if body.include_usage else {}
        answers = StreamedAnswers(parsing) if parsing.active else None
        plain = {job.index: TextChunkTemplate({**base, "choices": [{"index": job.index, "delta": {
            "content": text_marker()}, "logprobs": None, "finish_reason": None}], **extra}) for job in jobs}

        def to_chunk(delta: ChoiceDelta) -> str | dict | list[dict]:
            if not body.logprobs and answers is None and delta.text and delta.finish_reason is None:
                return plain[delta.index].render(delta.text)  # most tokens: only the text varies
            logprobs = chat_logprobs(serving.tokenizer, delta.logprobs) if body.logprobs else None
            if answers is not None:
                return [{**base, "choices": [{"index": delta.index, "delta": piece, "logprobs": logprobs if i == 0
                                              else None, "finish_reason": finish}], **extra}
                        for i, (piece, finish) in enumerate(answers.deltas(delta.index, delta.text,
                                                                             delta.finish_reason))]
            choice = {"index": delta.index, "delta": {"content": delta.text} if delta.text else {},
                      "logprobs": logprobs, "finish_reason": delta.finish_reason}
            return {**base, "choices": [choice], **extra}

        forced = calls is not None and calls.choice in ("required", "named")  # OpenAI's head has no content then
        head = [{**base, "choices": [{"index": job.index, "delta": {"role": "assistant",
                                                                    "content": None if forced else ""},
                                      "logprobs": None, "finish_reason": None}], **extra} for job in jobs]
        usage_chunk = (lambda usage: {**base, "choices": [], "usage": _with_reasoning_tokens(
            usage, serving, answers.reasoning_texts() if reasoning and answers else None)}) \
            if body.include_usage else None
        return await stream_choices(request, serving, jobs, ENDPOINT, req_id, head, to_chunk, usage_chunk)
    served_by: list[str] = []
    results = await collect_until_disconnect(request, serving, jobs, ENDPOINT, req_id, served_by)
    choices, reasoning_texts = [], []
    for r in results:
        message, finish, thought = message_of(parsing, r) if parsing.active else (
            {"role": "assistant", "content": r.text}, r.finish_reason, "")
        reasoning_texts.append(thought)
        choices.append({"index": r.index, "message": message, "finish_reason": finish,
                        "logprobs": chat_logprobs(serving.tokenizer, r.logprobs) if body.logprobs else None})
    # vLLM's place for them in chat: the response's, the prompt being the same for every choice
    prompt_logprobs = {} if body.prompt_logprobs is None else {"prompt_logprobs": vllm_prompt_logprobs(
        serving.tokenizer, prompt_ids, results[0].prompt_logprobs or [])}
    return JSONResponse({"id": response_id, "object": "chat.completion", "created": created,
                         "model": model.model_name, "choices": choices,
                         "usage": _with_reasoning_tokens(usage_of(results), serving,
                                                         reasoning_texts if reasoning else None),
                         **prompt_logprobs},
                        headers={"X-Request-Id": req_id, **replica_header(served_by)})
