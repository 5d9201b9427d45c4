"""The KV block pool: reference counts, a free queue in eviction order, and cached-block bookkeeping.

Invariants: a block is in the free queue exactly when its ref count is 0; a block with a key stays findable
in the prefix index until it is handed out again, least recently freed first; a referenced block is never
evicted. Each block held or cached has an owner tenant, counted in `tenants` (tenant_blocks.py); a free block
without a key has none. Allocation evicts the cached blocks of tenants over their quota first, then takes the
free queue's head.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pagedserve.services.scheduler.invariants import require
from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.services.scheduler.tenant_blocks import TenantBlocks


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: bytes | None = None  # prefix-cache key while the block holds a cached full block
    owner: str | None = None  # the tenant whose request allocated it, while it is held or cached


def _owner(block: Block) -> str:
    """The owner of a held or cached block (every such block has one)."""
    if block.owner is None:
        raise AssertionError(f"block {block.block_id} is held or cached without an owner")
    return block.owner


class BlockPool:
    def __init__(self, num_blocks: int, prefix_index: PrefixIndex) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # head = LRU
        self.prefix_index = prefix_index
        self.tenants = TenantBlocks()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def allocate(self, count: int, tenant: str = "") -> list[Block]:
        """Take `count` blocks for `tenant`: cached blocks of over-quota tenants first, then the free queue's head,
        evicting their cached keys."""
        if count > self.num_free_blocks:
            raise ValueError(f"asked for {count} blocks with {self.num_free_blocks} free")
        taken = []
        tenants = self.tenants
        for _ in range(count):
            block_id = tenants.over_quota_victim() if tenants.over else None
            if block_id is None:
                block_id = self.free_queue.popitem(last=False)[0]
            else:
                del self.free_queue[block_id]
            block = self.blocks[block_id]
            if block.key is not None:
                self.prefix_index.remove(block.key)
                block.key = None
                owner = _owner(block)
                tenants.drop_cached(owner, block_id)
                tenants.remove(owner)
            block.ref_count = 1
            block.owner = tenant
            tenants.add(tenant)
            taken.append(block)
        return taken

    def touch(self, blocks: list[Block], tenant: str = "") -> None:
        """Take a reference on blocks (a prefix hit's cached ones), pulling free ones out of the free queue; a free
        block without a key becomes `tenant`'s, a cached one stays its owner's."""
        for block in blocks:
            if block.ref_count == 0:
                del self.free_queue[block.block_id]
                if block.key is not None:
                    self.tenants.drop_cached(_owner(block), block.block_id)
                else:
                    block.owner = tenant
                    self.tenants.add(tenant)
            block.ref_count += 1

    def release(self, blocks: list[Block]) -> None:
        """Drop one reference from each block, in the given order; unreferenced ones join the free queue's tail."""
        for block in blocks:
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block.block_id} released more often than referenced"
            if block.ref_count == 0:
                self.free_queue[block.block_id] = None
                if block.key is not None:
                    self.tenants.push_cached(_owner(block), block.block_id)
                else:
                    self.tenants.remove(_owner(block))
                    block.owner = None

    def cache(self, block: Block, key: bytes) -> None:
        if block.key is None and self.prefix_index.insert(key, block.block_id):
            block.key = key

    def lookup(self, key: bytes) -> Block | None:
        block_id = self.prefix_index.get(key)
        return None if block_id is None else self.blocks[block_id]

    def check_tenants(self) -> None:
        """The tenant accounting agrees with the blocks (see tenant_blocks.py's invariants)."""
        count: dict[str, int] = {}
        cached: dict[str, list[int]] = {}
        for block in self.blocks:
            if block.ref_count == 0 and block.key is None:
                require(block.owner is None, f"free block {block.block_id} still has an owner")
                continue
            require(block.owner is not None, f"block {block.block_id} is held or cached without an owner")
            count[block.owner] = count.get(block.owner, 0) + 1
            if block.ref_count == 0:
                cached.setdefault(block.owner, []).append(block.block_id)
        tenants = self.tenants
        require(tenants.count == count, f"tenant block counts {tenants.count} != {count}")
        require({t: sorted(q) for t, q in tenants.cached.items()} == {t: sorted(ids) for t, ids in cached.items()},
                "tenant cached blocks disagree with the pool")
        free_order = {block_id: i for i, block_id in enumerate(self.free_queue)}
        for queue in tenants.cached.values():
            order = [free_order[block_id] for block_id in queue]
            require(order == sorted(order), "a tenant's cached blocks are out of the free queue's order")
        over = {t for t, q in tenants.quota.items() if count.get(t, 0) > q}
        require(tenants.over == over, f"over-quota tenants {sorted(tenants.over)} != {sorted(over)}")
