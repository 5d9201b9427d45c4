"""The KV block pool: reference counts, a free queue in eviction order, and cached-block bookkeeping.

Invariants: a block is in the free queue exactly when its ref count is 0; a block with a key stays findable
in the prefix index until it is handed out again, least recently freed first; a referenced block is never
evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pagedserve.services.scheduler.prefix_cache import PrefixIndex


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None  # prefix-cache key while the block holds a cached full block


class BlockPool:
    def __init__(self, num_blocks: int, prefix_index: PrefixIndex) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # head = LRU
        self.prefix_index = prefix_index

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate(self, count: int) -> list[Block]:
        """Take `count` blocks from the head of the free queue, evicting their cached keys."""
        if count > self.num_free_blocks:
            raise ValueError(f"asked for {count} blocks with {self.num_free_blocks} free")
        taken = []
        for _ in range(count):
            block = self.blocks[self.free_queue.popitem(last=False)[0]]
            if block.key is not None:
                self.prefix_index.remove(block.key)
                block.key = None
            block.ref_count = 1
            taken.append(block)
        return taken

    def touch(self, blocks: list[Block]) -> None:
        """Take a reference on cached blocks (a prefix hit), pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self.free_queue[block.block_id]
            block.ref_count += 1

    def release(self, blocks: list[Block]) -> None:
        """Drop one reference from each block, in the given order; unreferenced ones join the free queue's tail."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} released more often than referenced"
            if block.ref_count == 0:
                self.free_queue[block.block_id] = None

    def cache(self, block: Block, key: bytes) -> None:
        if block.key is None and self.prefix_index.insert(key, block.block_id):
            block.key = key

    def lookup(self, key: bytes) -> Block | None:
        block_id = self.prefix_index.get(key)
        return None if block_id is None else self.blocks[block_id]
