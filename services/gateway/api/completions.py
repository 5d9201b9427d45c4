"""POST /v1/completions: raw prompts (text or token ids, one or several), streamed (SSE) or whole."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from pagedserve.services.gateway.api.client_identity import client_key
from pagedserve.services.gateway.api.generation import ChoiceDelta, ChoiceResult
from pagedserve.services.gateway.api.logprobs_format import (
    completion_logprobs,
    echo_completion_logprobs,
    top_n,
    vllm_prompt_logprobs,
)
from pagedserve.services.gateway.api.protocol import CompletionRequest
from pagedserve.services.gateway.api.request_fields import check_extra_fields
from pagedserve.services.gateway.api.request_run import (
    collect_until_disconnect,
    replica_header,
    stream_choices,
)
from pagedserve.services.gateway.api.sampling import RequestShape, check_token_ids
from pagedserve.services.gateway.api.serving import Serving
from pagedserve.services.gateway.api.sse_template import TextChunkTemplate, text_marker
from pagedserve.services.gateway.api.usage import usage_of
from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.structured.structured_outputs import constraint_of
from pagedserve.services.gateway.text.tokenizer import PromptTokenizer

ENDPOINT = "completions"
SHAPE = RequestShape("prompt", "max_tokens", "logprobs")


async def _prompts(body: CompletionRequest, serving: Serving) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        return [await serving.encode_prompt(prompt, "prompt")]
    if not prompt:
        raise OpenAIError(400, "prompt must not be empty", param="prompt")
    if isinstance(prompt[0], int):
        return [check_token_ids(list(prompt), serving.limits.vocab_size, "prompt")]
    return [await serving.encode_prompt(p, "prompt") if isinstance(p, str) else
            check_token_ids(list(p), serving.limits.vocab_size, "prompt") for p in prompt]


def _check_unsupported(body: CompletionRequest) -> None:
    if body.suffix is not None:
        raise OpenAIError(400, "suffix is not supported", param="suffix")
    if body.max_tokens == 0 and not body.echo:
        raise OpenAIError(400, "max_tokens must be at least 1 (0 only with echo)", param="max_tokens",
                          code="invalid_value")


def prompt_logprobs_count(body: CompletionRequest) -> int | None:
    """The top-N to compute at each prompt position: vLLM's prompt_logprobs, or `logprobs` under echo (the larger
    when both are asked); None when neither is. Such answers are not streamed."""
    asked = [n for n in (body.prompt_logprobs, body.logprobs if body.echo else None) if n is not None]
    if not asked:
        return None
    if body.stream:
        raise OpenAIError(400, "prompt logprobs (prompt_logprobs, or echo with logprobs) are returned in "
                               "non-streamed answers only", param="stream")
    return max(asked)


def _choice_logprobs(body: CompletionRequest, tokenizer: PromptTokenizer, prompt_ids: list[int],
                     result: ChoiceResult) -> dict | None:
    if body.logprobs is None:
        return None
    if body.echo:
        return echo_completion_logprobs(tokenizer, prompt_ids, top_n(result.prompt_logprobs or [], body.logprobs),
                                        result.logprobs)
    return completion_logprobs(tokenizer, result.logprobs, 0)


def _without_output(result: ChoiceResult) -> ChoiceResult:
    """max_tokens 0 with prompt logprobs: the engine sampled one token (its step computes the prompt's last
    position); the answer shows none of it."""
    return replace(result, text="", logprobs=[], finish_reason="length", num_output_tokens=0)


def _echo_only(body: CompletionRequest, model_name: str, prompts: list[list[int]], echoes: list[str],
               req_id: str) -> JSONResponse | StreamingResponse:
    """max_tokens 0 with echo: the prompts back with no generation (the scheduler is not asked)."""
    base = {"id": f"cmpl-{req_id}", "object": "text_completion", "created": int(time.time()), "model": model_name}
    choices = [{"index": i * body.n + j, "text": echoes[i], "logprobs": None, "finish_reason": "length"}
               for i in range(len(prompts)) for j in range(body.n)]
    num_prompt_tokens = sum(len(p) for p in prompts) * body.n
    usage = {"prompt_tokens": num_prompt_tokens, "completion_tokens": 0, "total_tokens": num_prompt_tokens}
    if not body.stream:
        return JSONResponse({**base, "choices": choices, "usage": usage}, headers={"X-Request-Id": req_id})
    chunks = [{**base, "choices": [choice]} for choice in choices]
    chunks += [{**base, "choices": [], "usage": usage}] if body.include_usage else []
    events = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks] + ["data: [DONE]\n\n"]
    return StreamingResponse(iter(events), media_type="text/event-stream", headers={"X-Request-Id": req_id})


async def create_completion(body: CompletionRequest, serving: Serving, request: Request, req_id: str):
    model = serving.require_model(body.model)
    check_extra_fields(body)
    _check_unsupported(body)
    num_prompt_logprobs = prompt_logprobs_count(body)
    prompts = await _prompts(body, serving)
    if body.max_tokens == 0 and num_prompt_logprobs is None:
        return _echo_only(body, model.model_name, prompts, [serving.tokenizer.decode(p) for p in prompts], req_id)
    constraint = constraint_of(body)
    jobs = serving.build_jobs(body, prompts, req_id, 1 if body.max_tokens == 0 else body.max_tokens,
                              body.logprobs, SHAPE, prompt_logprobs=num_prompt_logprobs)
    jobs = serving.with_grammar(jobs, await serving.check_constraint(constraint, client_key(request)))
    echoes = [serving.tokenizer.decode(p) if body.echo else "" for p in prompts]
    response_id, created = f"cmpl-{req_id}", int(time.time())
    base = {"id": response_id, "object": "text_completion", "created": created, "model": model.model_name}
    if body.stream:
        extra = {"usage": None} if body.include_usage else {}
        offsets = {job.index: 0 for job in jobs}
        plain = {job.index: TextChunkTemplate({**base, "choices": [{"index": job.index, "text": text_marker(),
                                                                     "logprobs": None, "finish_reason": None}],
                                               **extra}) for job in jobs}

        def to_chunk(delta: ChoiceDelta) -> str | dict:
            if body.logprobs is None and delta.finish_reason is None:  # most tokens: only the text varies
                return plain[delta.index].render(delta.text)
            logprobs = None
            if body.logprobs is not None:
                logprobs = completion_logprobs(serving.tokenizer, delta.logprobs, offsets[delta.index])
                offsets[delta.index] += len(delta.text)
            choice = {"index": delta.index, "text": delta.text, "logprobs": logprobs,
                      "finish_reason": delta.finish_reason}
            return {**base, "choices": [choice], **extra}

        head = [{**base, "choices": [{"index": job.index, "text": echoes[job.prompt_index], "logprobs": None,
                                      "finish_reason": None}], **extra} for job in jobs if body.echo]
        usage_chunk = (lambda usage: {**base, "choices": [], "usage": usage}) if body.include_usage else None
        return await stream_choices(request, serving, jobs, ENDPOINT, req_id, head, to_chunk, usage_chunk)
    served_by: list[str] = []
    results = await collect_until_disconnect(request, serving, jobs, ENDPOINT, req_id, served_by)
    if body.max_tokens == 0:
        results = [_without_output(r) for r in results]
    sent = {job.index: job.request.prompt_token_ids for job in jobs}  # after truncate_prompt_tokens
    choices = [{"index": r.index, "text": echoes[r.prompt_index] + r.text,
                "logprobs": _choice_logprobs(body, serving.tokenizer, sent[r.index], r),
                "finish_reason": r.finish_reason} for r in results]
    if body.prompt_logprobs is not None:
        for choice, r in zip(choices, results, strict=True):
            choice["prompt_logprobs"] = vllm_prompt_logprobs(serving.tokenizer, sent[r.index],
                                                             top_n(r.prompt_logprobs or [], body.prompt_logprobs))
    return JSONResponse({"id": response_id, "object": "text_completion", "created": created,
                         "model": model.model_name, "choices": choices, "usage": usage_of(results)},
                        headers={"X-Request-Id": req_id, **replica_header(served_by)})
