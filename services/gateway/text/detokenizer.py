"""Incremental detokenization that never emits half a character and skips special tokens (EOS) in text.

`tokenizers.decoders.DecodeStream` does the work in Rust: it keeps a small window of the tokens already emitted as
context (leading spaces), and releases the text of new tokens only once it no longer ends in half a UTF-8
character (a byte-level token can end inside one). The stream starts from the prompt's last tokens, for tokenizers
that strip a leading space; prompt tokens that end in half a character are not context but the first tokens held
back, so that the output that completes the character shows it whole. DecodeStream holds back an incomplete
character without end: `flush` decodes what it holds at the end of generation, an incomplete character included
(as U+FFFD).

    ids: [... context (last tokens emitted) | pending (held back) | new tokens ...]
"""

from __future__ import annotations

from typing import Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

REPLACEMENT_CHAR = "\ufffd"
NUM_CONTEXT_TOKENS = 4  # prompt tokens the stream starts from; tokens kept before the held-back ones, for `flush`


class Decoder(Protocol):
    """A Hugging Face fast tokenizer (or the gateway's PromptTokenizer): its Rust tokenizer and a full decode."""

    @property
    def backend_tokenizer(self) -> Tokenizer: ...
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer
        self._context = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])  # the last tokens whose text was emitted
        self._pending: list[int] = []  # tokens whose text the stream holds back
        while self._context and tokenizer.decode(self._context, skip_special_tokens=True).endswith(REPLACEMENT_CHAR):
            self._pending.insert(0, self._context.pop())
        self._stream = DecodeStream(self._context, skip_special_tokens=True)
        self._unfed = bool(self._pending)  # the held-back prompt tokens go to the stream with the first outputs

    def add(self, token_ids: list[int]) -> str:
        """Text completed by these new tokens ('' while a character is still incomplete)."""
        text = self._stream.step(self._backend, self._pending + token_ids if self._unfed else token_ids)
        self._unfed = False
        if text is None:
            self._pending.extend(token_ids)
            return ""
        self._context = (self._context + self._pending + token_ids)[-NUM_CONTEXT_TOKENS:]
        self._pending = []
        return text

    def flush(self) -> str:
        """At the end of generation: whatever is left, an incomplete character included (as U+FFFD)."""
        if not self._pending or self._unfed:  # no output, or nothing held back
            return ""
        prefix_text = self.tokenizer.decode(self._context, skip_special_tokens=True)
        full_text = self.tokenizer.decode(self._context + self._pending, skip_special_tokens=True)
        self._context, self._pending = (self._context + self._pending)[-NUM_CONTEXT_TOKENS:], []
        return full_text[len(prefix_text):] if len(full_text) > len(prefix_text) else ""
