"""Prefix-cache keys and the key -> block index.

A full block's key hashes its parent's key, its token ids and the request's extra keys (a cache salt), so two
blocks have equal keys exactly when their whole prefixes are equal. Only full blocks are ever keyed.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass

ROOT_KEY = b"pagedserve-root"


def block_key(parent_key: bytes, token_ids: list[int], extra_key: str | None = None) -> bytes:
    digest = hashlib.blake2b(parent_key, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    if extra_key is not None:
        digest.update(b"\x00salt\x00" + extra_key.encode())
    return digest.digest()


def extend_block_keys(keys: list[bytes], token_ids: list[int], block_size: int, salt: str | None) -> None:
    """Append keys for every full block of token_ids not yet keyed (keys[i] covers block i)."""
    for index in range(len(keys), len(token_ids) // block_size):
        parent = keys[index - 1] if index else ROOT_KEY
        # the salt enters the first block only: every later key descends from it
        keys.append(block_key(parent, token_ids[index * block_size: (index + 1) * block_size],
                              salt if index == 0 else None))


@dataclass
class PrefixCacheCounters:
    num_queries: int = 0  # prompt tokens looked up
    num_hits: int = 0  # of those, tokens found cached
    num_evictions: int = 0  # cached blocks handed out for new data

    @property
    def hit_rate(self) -> float:
        return self.num_hits / self.num_queries if self.num_queries else 0.0


class PrefixIndex:
    """Key -> block id for cached full blocks. A key maps to at most one block and a block to at most one key."""

    def __init__(self) -> None:
        self._block_of_key: dict[bytes, int] = {}
        self.counters = PrefixCacheCounters()

    def __len__(self) -> int:
        return len(self._block_of_key)

    def get(self, key: bytes) -> int | None:
        return self._block_of_key.get(key)

    def insert(self, key: bytes, block_id: int) -> bool:
        """Index a newly full block; False when an equal prefix is already cached in another block."""
        if key in self._block_of_key:
            return False
        self._block_of_key[key] = block_id
        return True

    def remove(self, key: bytes) -> None:
        del self._block_of_key[key]
        self.counters.num_evictions += 1

    def keys(self) -> list[bytes]:
        return list(self._block_of_key)
