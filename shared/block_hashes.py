"""Prefix-cache block keys: one hash chain, shared by the scheduler (its cache) and the gateway (its router).

A full block's key hashes its parent's key, its token ids and, for the first block only, the request's cache
salt, so two blocks have equal keys exactly when their whole prefixes (and salts) are equal. Only full blocks are
keyed. The gateway predicts a replica's cache hit with these same keys, so any change here changes both sides.
"""

from __future__ import annotations

import hashlib
from array import array

ROOT_KEY = b"pagedserve-root"
_SALT_TAG = b"\x00salt\x00"
_TOKEN_BYTES = array("q").itemsize  # tokens are hashed as little-endian int64s (the machine's order)


def block_key(parent_key: bytes, token_ids: list[int], extra_key: str | None = None) -> bytes:
    return _key(parent_key, array("q", token_ids).tobytes(), extra_key)


def _key(parent_key: bytes, token_bytes: bytes | memoryview, extra_key: str | None) -> bytes:
    digest = hashlib.blake2b(parent_key, digest_size=16)
    digest.update(token_bytes)
    if extra_key is not None:
        digest.update(_SALT_TAG + extra_key.encode())
    return digest.digest()


def extend_block_keys(keys: list[bytes], token_ids: list[int], block_size: int, salt: str | None,
                      max_blocks: int | None = None) -> None:
    """Append keys for every full block of token_ids not yet keyed (keys[i] covers block i), up to max_blocks."""
    num_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    start = len(keys)
    if start >= num_blocks:
        return
    # one conversion for the whole range: slicing bytes is far cheaper than an array per block
    data = memoryview(array("q", token_ids[start * block_size: num_blocks * block_size]).tobytes())
    stride = block_size * _TOKEN_BYTES
    parent = keys[start - 1] if start else ROOT_KEY
    offset = 0
    if start == 0:  # the salt enters the first block only: every later key descends from it
        parent = _key(ROOT_KEY, data[:stride], salt)
        keys.append(parent)
        offset = stride
    blake2b = hashlib.blake2b
    for end in range(offset + stride, len(data) + 1, stride):
        digest = blake2b(parent, digest_size=16)
        digest.update(data[end - stride:end])
        parent = digest.digest()
        keys.append(parent)


def num_hittable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks a prompt of `num_tokens` can take from the cache: at least one token is always computed."""
    return max(0, (num_tokens - 1) // block_size)


def prompt_block_keys(token_ids: list[int], block_size: int, salt: str | None) -> list[bytes]:
    """Keys of the blocks of a prompt that a scheduler could serve from its cache (what a router looks up)."""
    keys: list[bytes] = []
    extend_block_keys(keys, token_ids, block_size, salt, num_hittable_blocks(len(token_ids), block_size))
    return keys
