"""The shared block-key chain: equal to the per-block definition, resumable, capped where a cache can hit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pagedserve.shared.block_hashes import (
    ROOT_KEY,
    block_key,
    extend_block_keys,
    num_hittable_blocks,
    prompt_block_keys,
)


def reference_keys(tokens: list[int], block_size: int, salt: str | None) -> list[bytes]:
    keys, parent = [], ROOT_KEY
    for index in range(len(tokens) // block_size):
        parent = block_key(parent, tokens[index * block_size:(index + 1) * block_size], salt if index == 0 else None)
        keys.append(parent)
    return keys


@given(st.lists(st.integers(0, 2**31 - 1), max_size=70), st.sampled_from([1, 4, 16]),
       st.sampled_from([None, "", "tenant-a"]), st.integers(0, 70))
def test_extending_in_two_goes_equals_the_per_block_chain(tokens, block_size, salt, cut):
    keys: list[bytes] = []
    extend_block_keys(keys, tokens[:cut], block_size, salt)
    extend_block_keys(keys, tokens, block_size, salt)
    assert keys == reference_keys(tokens, block_size, salt)


def test_max_blocks_caps_and_a_later_call_resumes():
    tokens = list(range(40))
    keys: list[bytes] = []
    extend_block_keys(keys, tokens, 4, "s", max_blocks=3)
    assert keys == reference_keys(tokens, 4, "s")[:3]
    extend_block_keys(keys, tokens, 4, "s")
    assert keys == reference_keys(tokens, 4, "s")


def test_a_prompt_keys_only_blocks_a_cache_can_serve():
    # 32 tokens in blocks of 16: the last token is always computed, so only the first block can be a hit
    assert num_hittable_blocks(32, 16) == 1 and num_hittable_blocks(33, 16) == 2 and num_hittable_blocks(0, 16) == 0
    tokens = list(range(33))
    assert prompt_block_keys(tokens, 16, None) == reference_keys(tokens, 16, None)
    assert len(prompt_block_keys(tokens[:32], 16, None)) == 1
    assert prompt_block_keys(tokens, 16, "a")[0] != prompt_block_keys(tokens, 16, None)[0]
