"""The model's own tokenizer and chat template (transformers AutoTokenizer from the model folder)."""

from __future__ import annotations

import functools

from transformers import AutoTokenizer

from services.gateway.errors import OpenAIError


class PromptTokenizer:
    def __init__(self, model_dir: str) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def chat_prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation through the chat template, ending with the assistant's turn header."""
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template may raise (e.g. on a role order it forbids)
            raise OpenAIError(400, f"the chat template rejected the messages: {exc}", param="messages") from exc
        return self.encode(text, add_special_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one tokenizer per process, kept for its lifetime
    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (for logprobs)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)
