"""Text of an exact token length, built from random token ids and re-tokenised until it round-trips."""

import re
from dataclasses import dataclass

import numpy as np

from pagedserve.benchmarks.tokenizer import BenchTokenizer

# Single tokens that decode to " word": joined, they re-tokenise to the same ids in byte-level BPE vocabularies.
_WORD_TOKEN = re.compile(r"^ [a-z]{3,10}$")
_MAX_FIXUP_ROUNDS = 8


@dataclass(frozen=True)
class TokenPool:
    """Token ids that are safe to draw prompt text from."""

    token_ids: np.ndarray

    @classmethod
    def from_tokenizer(cls, tokenizer: BenchTokenizer) -> "TokenPool":
        texts = tokenizer.tokenizer.decode_batch([[i] for i in range(tokenizer.vocab_size)])
        words = [i for i, text in enumerate(texts) if _WORD_TOKEN.match(text)]
        if len(words) < 100:  # not a byte-level BPE vocabulary: fall back to any non-special token
            words = [i for i, text in enumerate(texts) if text.strip() and not text.startswith("<")]
        return cls(np.asarray(words, dtype=np.int64))

    def sample(self, rng: np.random.Generator, num_tokens: int) -> list[int]:
        return rng.choice(self.token_ids, size=num_tokens).tolist()


def exact_text(
    tokenizer: BenchTokenizer, pool: TokenPool, rng: np.random.Generator, token_ids: list[int], num_tokens: int
) -> tuple[str, int]:
    """Decode `token_ids`, then trim or extend until the text re-encodes to `num_tokens` tokens.

    Returns the text and its actual token count, which equals `num_tokens` unless the tokenizer never converged.
    Only the tail is ever changed, so a shared leading part of `token_ids` stays shared.
    """
    ids = list(token_ids)
    text = tokenizer.decode(ids)
    for _ in range(_MAX_FIXUP_ROUNDS):
        ids = tokenizer.encode(text)
        if len(ids) == num_tokens:
            return text, num_tokens
        if len(ids) > num_tokens:
            ids = ids[:num_tokens]
        else:
            ids = ids + pool.sample(rng, num_tokens - len(ids))
        text = tokenizer.decode(ids)
    return text, tokenizer.count(text)


def random_text(tokenizer: BenchTokenizer, pool: TokenPool, rng: np.random.Generator, num_tokens: int) -> str:
    """Random words of exactly `num_tokens` tokens (best effort for unusual tokenizers)."""
    return exact_text(tokenizer, pool, rng, pool.sample(rng, num_tokens), num_tokens)[0]
