"""The only block-level API the scheduler uses: prefix lookups, slot allocation, caching and freeing.

Blocks are counted per tenant (held + cached, tenant_blocks.py); a request carrying a KV-cache share gives its
tenant a quota of `floor(share * num_blocks)` blocks (at least one), whose excess is evicted first."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.scheduler.block_pool import Block, BlockPool
from pagedserve.services.scheduler.invariants import require
from pagedserve.services.scheduler.prefix_cache import InFlightKeys, PrefixIndex
from pagedserve.services.scheduler.request import Request
from pagedserve.shared.block_hashes import extend_block_keys


@dataclass
class PrefixHit:
    blocks: list[Block]

    def num_tokens(self, block_size: int) -> int:
        return len(self.blocks) * block_size


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, watermark: float) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_index = PrefixIndex()
        self.pool = BlockPool(num_blocks, self.prefix_index)
        self.watermark_blocks = int(watermark * num_blocks)
        self.blocks_of: dict[str, list[Block]] = {}  # req_id -> its blocks in logical order
        self.num_cached_of: dict[str, int] = {}  # req_id -> how many of its leading blocks are already indexed
        self.in_flight = InFlightKeys()  # full blocks running requests are still to compute

    @property
    def usage(self) -> float:
        return self.pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, req_id: str) -> list[int]:
        return [b.block_id for b in self.blocks_of.get(req_id, [])]

    def find_prefix(self, request: Request) -> PrefixHit:
        """Longest run of cached full blocks; at least one token is always left to compute (for logits). None for
        a request asking for prompt logprobs: every prompt position's logits must be computed (its own blocks are
        still indexed once computed)."""
        if not self.enable_prefix_caching:
            return PrefixHit([])
        extend_block_keys(request.block_hashes, request.token_ids, self.block_size, request.cache_salt)
        if request.sampling.prompt_logprobs is not None:
            return PrefixHit([])
        hit: list[Block] = []
        for key in request.block_hashes[:self._max_hit_blocks(request)]:
            block = self.pool.lookup(key)
            if block is None:
                break
            hit.append(block)
        return PrefixHit(hit)

    def _max_hit_blocks(self, request: Request) -> int:
        return (request.num_tokens - 1) // self.block_size

    def prefix_in_flight(self, request: Request, prefix: PrefixHit) -> bool:
        """Whether the first block the request could still hit, past `prefix`, is being computed by a running one."""
        index = len(prefix.blocks)
        if (not self.enable_prefix_caching or index >= self._max_hit_blocks(request)
                or request.sampling.prompt_logprobs is not None):  # it reads no hit: nothing to wait for
            return False
        return request.block_hashes[index] in self.in_flight

    def mark_in_flight(self, request: Request, prefix: PrefixHit) -> None:
        """At admission (after `find_prefix`): the request's full blocks past its hit are in flight until computed."""
        if self.enable_prefix_caching:
            self.in_flight.add(request.req_id, request.block_hashes, len(prefix.blocks))

    def record_prefix_query(self, num_tokens: int, prefix: PrefixHit) -> None:
        """Count a prompt's lookup once, when it is first admitted (nothing is counted with caching off)."""
        if not self.enable_prefix_caching:
            return
        counters = self.prefix_index.counters
        counters.num_queries += num_tokens
        counters.num_hits += prefix.num_tokens(self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int, prefix: PrefixHit | None = None,
                       admission: bool = False) -> list[int] | None:
        """Blocks for `num_new_tokens` more tokens after the computed ones (and the prefix hit), or None when the
        pool cannot give them. Admissions must also leave the watermark free. Returns the ids appended."""
        hit = prefix.blocks if prefix else []
        owned = self.blocks_of.setdefault(request.req_id, [])
        num_computed = request.num_computed_tokens + len(hit) * self.block_size
        num_new_blocks = max(0, self.blocks_needed(num_computed + num_new_tokens) - len(owned) - len(hit))
        num_hit_free = sum(1 for b in hit if b.ref_count == 0)  # touching these takes them off the free queue
        reserve = self.watermark_blocks if admission else 0
        if num_new_blocks + num_hit_free + reserve > self.pool.num_free_blocks:
            if not owned:
                del self.blocks_of[request.req_id]
            return None
        self.pool.tenants.set_quota(request.tenant, self.quota_blocks(request.kv_cache_share))
        self.pool.touch(hit, request.tenant)
        appended = hit + self.pool.allocate(num_new_blocks, request.tenant)
        owned.extend(appended)
        return [b.block_id for b in appended]

    def quota_blocks(self, share: float | None) -> int | None:
        """The block quota of a tenant given `share` of the pool (None: no quota)."""
        return None if share is None else max(1, int(share * self.pool.num_blocks))

    def over_quota(self, tenant: str) -> bool:
        """Whether the tenant holds and caches more blocks than its quota."""
        return self.pool.tenants.is_over(tenant)

    def blocks_by_tenant(self) -> dict[str, int]:
        """Each tenant's blocks held + cached (tenants with none are absent)."""
        return dict(self.pool.tenants.count)

    def cache_full_blocks(self, request: Request) -> None:
        """Index every block of the request that is now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        extend_block_keys(request.block_hashes, request.token_ids, self.block_size, request.cache_salt)
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes))
        blocks = self.blocks_of[request.req_id]
        for index in range(self.num_cached_of.get(request.req_id, 0), num_full):
            self.pool.cache(blocks[index], request.block_hashes[index])
        self.num_cached_of[request.req_id] = max(num_full, self.num_cached_of.get(request.req_id, 0))
        self.in_flight.advance(request.req_id, num_full)

    def free_tail(self, request: Request, num_tokens: int) -> None:
        """Release the request's blocks past those its first `num_tokens` tokens need (a rejected draft tail: never
        indexed, as indexing covers only accepted tokens)."""
        blocks = self.blocks_of.get(request.req_id, [])
        keep = self.blocks_needed(num_tokens)
        if len(blocks) > keep:
            tail = blocks[keep:]
            del blocks[keep:]
            self.pool.release(list(reversed(tail)))

    def free(self, request: Request) -> None:
        """Release all blocks of the request; its last blocks go first in the eviction order."""
        blocks = self.blocks_of.pop(request.req_id, [])
        self.num_cached_of.pop(request.req_id, None)
        self.in_flight.discard(request.req_id)
        self.pool.release(list(reversed(blocks)))

    def check_integrity(self) -> None:
        """free + in use == total; ref counts equal owners; free <=> unreferenced; keys and in-flight keys agree."""
        owners: dict[int, int] = {}
        for req_id, blocks in self.blocks_of.items():
            require(len({b.block_id for b in blocks}) == len(blocks), f"request {req_id} owns a block twice")
            for block in blocks:
                owners[block.block_id] = owners.get(block.block_id, 0) + 1
        for block in self.pool.blocks:
            require(block.ref_count == owners.get(block.block_id, 0), f"block {block.block_id} ref count mismatch")
            require((block.ref_count == 0) == (block.block_id in self.pool.free_queue),
                    f"block {block.block_id} is free but referenced, or referenced but not free")
            if block.key is not None:
                require(self.prefix_index.get(block.key) == block.block_id, f"block {block.block_id} key not indexed")
        require(len(owners) + self.pool.num_free_blocks == self.pool.num_blocks, "blocks lost or double counted")
        require(len(self.prefix_index) == sum(1 for b in self.pool.blocks if b.key is not None),
                "prefix index and block keys disagree")
        self.pool.check_tenants()
        self._check_in_flight()

    def _check_in_flight(self) -> None:
        """Only live requests have blocks in flight, none of them already computed; none with caching off."""
        self.in_flight.check()
        require(self.in_flight.req_ids <= set(self.blocks_of), "a request without blocks has blocks in flight")
        require(self.enable_prefix_caching or not len(self.in_flight), "blocks in flight with prefix caching off")
        for req_id in self.in_flight.req_ids:
            require(self.in_flight.next_block(req_id) >= self.num_cached_of.get(req_id, 0), f"request {req_id}")
