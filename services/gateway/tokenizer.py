"""The model's own tokenizer and its chat template (transformers AutoTokenizer from the model folder).

The chat template is, in order: a request's own `chat_template` (only with --trust-request-chat-template, as in
vLLM), the server's --chat-template (a file or the template itself), the model folder's. A model with none of
them cannot serve chat: such requests get a 400 that says so, and the gateway warns at start.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoTokenizer

from services.gateway.chat_template import load_chat_template
from services.gateway.errors import OpenAIError

# apply_chat_template arguments a request's chat_template_kwargs may not set (they change what the call returns)
_RESERVED_KWARGS = frozenset({"conversation", "messages", "chat_template", "tokenize", "return_dict",
                              "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
                              "return_assistant_tokens_mask"})
NO_TEMPLATE = ("this model has no chat template, so it cannot answer chat requests: start the server with "
               "--chat-template FILE|TEMPLATE, or send text to /v1/completions")


@dataclass(frozen=True)
class ChatTemplateArgs:
    """How a request renders its conversation (vLLM's request fields of the same names)."""

    template: str | None = None  # the request's own template; None: the server's
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables (e.g. enable_thinking)
    add_generation_prompt: bool = True  # end with the assistant's turn header
    continue_final_message: bool = False  # leave the last (assistant) message open, to be continued


class PromptTokenizer:
    def __init__(self, model_dir: str, chat_template: str | None = None) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.chat_template: str | None = load_chat_template(chat_template) if chat_template else \
            getattr(self.tokenizer, "chat_template", None)

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def chat_prompt_ids(self, messages: list[dict[str, str]], args: ChatTemplateArgs | None = None) -> list[int]:
        """Token ids of a conversation through the chat template (by default ending with the assistant's header)."""
        args = args or ChatTemplateArgs()
        template = args.template or self.chat_template
        if not template:
            raise OpenAIError(400, NO_TEMPLATE, param="messages", code="missing_chat_template")
        reserved = sorted(_RESERVED_KWARGS & set(args.kwargs))
        if reserved:
            raise OpenAIError(400, f"chat_template_kwargs may not set {', '.join(reserved)}",
                              param="chat_template_kwargs")
        if args.continue_final_message and (args.add_generation_prompt or messages[-1]["role"] != "assistant"):
            raise OpenAIError(400, "continue_final_message needs add_generation_prompt false and a last message "
                                   "from the assistant", param="continue_final_message")
        options = {"add_generation_prompt": args.add_generation_prompt,
                   "continue_final_message": args.continue_final_message, **args.kwargs}
        try:
            text = self.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **options)
        except Exception as exc:  # the template may raise (e.g. on a role order it forbids) or not compile
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
