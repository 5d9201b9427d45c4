"""Logprobs in the two OpenAI shapes: chat's `content` list and completions' parallel lists."""

from __future__ import annotations

from dataclasses import replace

from pagedserve.services.gateway.text.tokenizer import PromptTokenizer
from pagedserve.shared.step_protocol import TokenLogprobs


def _entry(tokenizer: PromptTokenizer, token_id: int, logprob: float) -> dict:
    text = tokenizer.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(tokenizer: PromptTokenizer, logprobs: list[TokenLogprobs]) -> dict:
    return {"content": [
        {**_entry(tokenizer, lp.token_id, lp.logprob),
         "top_logprobs": [_entry(tokenizer, t, v) for t, v in zip(lp.top_token_ids, lp.top_logprobs, strict=True)]}
        for lp in logprobs]}


def completion_logprobs(tokenizer: PromptTokenizer, logprobs: list[TokenLogprobs], text_offset_start: int) -> dict:
    tokens = [tokenizer.token_text(lp.token_id) for lp in logprobs]
    offsets, offset = [], text_offset_start
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{tokenizer.token_text(t): v for t, v in zip(lp.top_token_ids, lp.top_logprobs,
                                                                          strict=True)} for lp in logprobs],
            "text_offset": offsets}


def echo_completion_logprobs(tokenizer: PromptTokenizer, prompt_ids: list[int], prompt: list[TokenLogprobs],
                             output: list[TokenLogprobs]) -> dict:
    """`echo` with `logprobs`: the prompt's tokens then the completion's, in completions' parallel lists. The
    prompt's first token has no logprob (null in token_logprobs and top_logprobs), as OpenAI's legacy API gives."""
    first = tokenizer.token_text(prompt_ids[0])
    head = {"tokens": [first], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}
    rest = completion_logprobs(tokenizer, [*prompt, *output], len(first))
    return {key: head[key] + rest[key] for key in head}


def vllm_prompt_logprobs(tokenizer: PromptTokenizer, prompt_ids: list[int], prompt: list[TokenLogprobs]
                         ) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then per token a map from token id (a string in
    JSON) to its logprob, rank and text, holding the prompt's own token and the top N at that position."""
    out: list[dict | None] = [None] * min(1, len(prompt_ids))
    for lp in prompt:
        entries = {t: (v, rank) for rank, (t, v) in enumerate(zip(lp.top_token_ids, lp.top_logprobs, strict=True), 1)}
        entries.setdefault(lp.token_id, (lp.logprob, lp.rank))
        out.append({str(t): {"logprob": v, "rank": rank, "decoded_token": tokenizer.token_text(t)}
                    for t, (v, rank) in entries.items()})
    return out


def top_n(logprobs: list[TokenLogprobs], n: int) -> list[TokenLogprobs]:
    """The entries with their alternatives cut to the top n (a request computed more for its other field)."""
    return [replace(lp, top_token_ids=lp.top_token_ids[:n], top_logprobs=lp.top_logprobs[:n]) for lp in logprobs]
