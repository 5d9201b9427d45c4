"""Logprobs in the two OpenAI shapes: chat's `content` list and completions' parallel lists."""

from __future__ import annotations

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
