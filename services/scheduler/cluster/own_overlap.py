"""This replica's Overlap (shared/block_overlap.py) with every other replica, computed exactly inside Redis.

Contract: the other replicas are every `pagedserve:{instance}:prefix_blocks` set in the database (SCAN; a stopped
replica's set expires redis_instance_ttl_s after its last write, so it counts that long). One MULTI/EXEC reads
SCARD of this replica's set and SDIFFSTORE of it minus all the others into a scratch key that the same transaction
deletes: both numbers come from one consistent state, only two integers cross the network, and nobody else sees
the scratch key. A missing set is an empty cache (Overlap(0, 0): ratio 1.0, nothing lost by removing it). Redis
pays one SDIFF (O(this set's size x replicas)) per call; callers run it every few seconds at most.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from pagedserve.shared.block_overlap import Overlap
from pagedserve.shared.replica_keys import (
    PREFIX_BLOCKS_PATTERN,
    instance_of_prefix_blocks_key,
    prefix_blocks_key,
    unique_scratch_key,
)

SCAN_COUNT = 10_000  # keys examined per SCAN call


async def other_instances(client: aioredis.Redis, instance_id: str) -> list[str]:
    found: set[str] = set()
    async for key in client.scan_iter(match=PREFIX_BLOCKS_PATTERN, count=SCAN_COUNT, _type="SET"):
        name = instance_of_prefix_blocks_key(key.decode() if isinstance(key, bytes) else key)
        if name != instance_id:
            found.add(name)
    return sorted(found)


async def own_overlap(client: aioredis.Redis, instance_id: str) -> Overlap:
    others = [prefix_blocks_key(name) for name in await other_instances(client, instance_id)]
    own, scratch = prefix_blocks_key(instance_id), unique_scratch_key(instance_id)
    async with client.pipeline(transaction=True) as pipe:
        pipe.scard(own)
        pipe.sdiffstore(scratch, [own, *others])
        pipe.delete(scratch)
        blocks, unique, _ = await pipe.execute()
    return Overlap(int(blocks), int(unique))
