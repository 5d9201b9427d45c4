"""The model's own tokenizer and its chat template (transformers AutoTokenizer from the model folder).

The chat template is, in order: a request's own `chat_template` (only with --trust-request-chat-template, as in
vLLM), the server's --chat-template (a file or the template itself), the model folder's. A model with none of
them cannot serve chat: such requests get a 400 that says so, and the gateway warns at start.

Prompts are tokenized and templated on a small thread pool, off the event loop, so that a long prompt delays only
its own request (the Rust tokenizer releases the GIL while it works). A text too long to fit the context is refused
before any tokenizing where the tokenizer allows a bound (see `num_tokens_at_least`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tokenizers import Tokenizer, decoders
from transformers import AutoTokenizer

from pagedserve.services.gateway.http.errors import OpenAIError
from pagedserve.services.gateway.text.chat_template import load_chat_template

# apply_chat_template arguments a request's chat_template_kwargs may not set (they change what the call returns)
_RESERVED_KWARGS = frozenset({"conversation", "messages", "chat_template", "tokenize", "return_dict",
                              "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
                              "return_assistant_tokens_mask"})
T = TypeVar("T")
NO_TEMPLATE = ("this model has no chat template, so it cannot answer chat requests: start the server with "
               "--chat-template FILE|TEMPLATE, or send text to /v1/completions")


@dataclass(frozen=True)
class ChatTemplateArgs:
    """How a request renders its conversation (vLLM's request fields of the same names)."""

    template: str | None = None  # the request's own template; None: the server's
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables (e.g. enable_thinking)
    add_generation_prompt: bool = True  # end with the assistant's turn header
    continue_final_message: bool = False  # leave the last (assistant) message open, to be continued


class PromptTooLong(Exception):
    """The text holds at least `num_tokens` tokens, known without tokenizing it."""

    def __init__(self, num_tokens: int) -> None:
        super().__init__(f"at least {num_tokens} tokens")
        self.num_tokens = num_tokens


class PromptTokenizer:
    def __init__(self, model_dir: str, chat_template: str | None = None, num_threads: int = 2) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.chat_template: str | None = load_chat_template(chat_template) if chat_template else \
            getattr(self.tokenizer, "chat_template", None)
        self.max_token_chars = _max_token_chars(self.tokenizer)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenizer")

    def num_tokens_at_least(self, text: str) -> int:
        """A lower bound on the text's token count, from its length alone (0 when the tokenizer allows none).

        A byte-level BPE without normalizer covers every input byte with some token, and no token covers more than
        `max_token_chars` characters, so a text of n characters holds at least n / max_token_chars tokens."""
        return -(-len(text) // self.max_token_chars) if self.max_token_chars else 0

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def supports_tools(self, args: ChatTemplateArgs | None = None) -> bool:
        """Whether the chat template renders `tools` itself (else tools.py writes them into the system prompt)."""
        template = (args.template if args is not None else None) or self.chat_template
        return isinstance(template, str) and "tools" in template

    def chat_prompt_ids(self, messages: list[dict], args: ChatTemplateArgs | None = None,
                        max_num_tokens: int | None = None, tools: list[dict] | None = None) -> list[int]:
        """Token ids of a conversation through the chat template (by default ending with the assistant's header);
        raises PromptTooLong when the rendered text surely holds max_num_tokens or more. `tools` go to templates
        that render them (see supports_tools)."""
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
            text = self.tokenizer.apply_chat_template(messages, chat_template=template, tools=tools, tokenize=False,
                                                      **options)
        except Exception as exc:  # the template may raise (e.g. on a role order it forbids) or not compile
            raise OpenAIError(400, f"the chat template rejected the messages: {exc}", param="messages") from exc
        return self.encode(text, add_special_tokens=False, max_num_tokens=max_num_tokens)

    def encode(self, text: str, add_special_tokens: bool = True, max_num_tokens: int | None = None) -> list[int]:
        """Raises PromptTooLong, without tokenizing, when the text surely holds max_num_tokens or more."""
        if max_num_tokens is not None and self.num_tokens_at_least(text) >= max_num_tokens:
            raise PromptTooLong(self.num_tokens_at_least(text))
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The Rust tokenizer underneath (streaming detokenization uses it)."""
        return self.tokenizer.backend_tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one tokenizer per process, kept for its lifetime
    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (for logprobs)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    async def off_loop(self, work: Callable[..., T], *args) -> T:
        """`work(*args)` on the tokenizer's thread pool (at most num_threads at once; the rest queue)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, work, *args)


def _max_token_chars(tokenizer) -> int | None:
    """The most characters one token stands for, when the tokenizer is byte-level without normalizer (every input
    byte lands in some token); None otherwise (a normalizer may shrink the text, a pre-tokenizer may drop some)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None or not isinstance(backend.decoder, decoders.ByteLevel):
        return None
    vocab = tokenizer.get_vocab()
    return max(len(tokenizer.convert_tokens_to_string([token]).encode()) for token in vocab) if vocab else None
