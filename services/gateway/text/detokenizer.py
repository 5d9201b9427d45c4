"""Incremental detokenization that never emits half a character and skips special tokens (EOS) in text.

A byte-level token can end in the middle of a UTF-8 character; decoding it alone gives U+FFFD. Text is read
from a small sliding window: `prefix` tokens were already emitted and give context (leading spaces), `read`
marks the end of what was emitted. New text is released only when the window no longer ends in U+FFFD.

    ids: [... | prefix_offset ... read_offset | new tokens ...]
               `-- decoded for context --'    `-- emitted when the decode is clean
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
NUM_CONTEXT_TOKENS = 4  # prompt tokens decoded with the first outputs, for tokenizers that strip a leading space


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self._ids = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, token_ids: list[int]) -> str:
        """Text completed by these new tokens ('' while a character is still incomplete)."""
        self._ids.extend(token_ids)
        return self._read(final=False)

    def flush(self) -> str:
        """At the end of generation: whatever is left, an incomplete character included (as U+FFFD)."""
        return self._read(final=True)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self._ids[start:end], skip_special_tokens=True)

    def _read(self, final: bool) -> str:
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return full_text[len(prefix_text):]
