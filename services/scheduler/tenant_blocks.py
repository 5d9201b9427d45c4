"""Each tenant's KV blocks (held + cached) against its optional quota, and its cached blocks in eviction order.

A block counts for its owner, the tenant whose request allocated it, from its allocation until it holds nothing:
while referenced (held, whoever else shares it) and while unreferenced but still in the prefix cache (cached,
evictable). It stops counting when it is released without a key or when its cached key is evicted. The quota is
soft: a tenant may hold more while the pool has room, but its cached blocks are evicted before anyone else's once it
is over, and preemption picks its requests first (Scheduler._victim_index).

Invariants (BlockPool.check_tenants): `count[t]` is the number of blocks owned by `t` that are referenced or keyed
(no zero entries); `cached[t]` holds exactly `t`'s unreferenced keyed blocks, least recently freed first; `over` is
exactly the tenants whose count exceeds their quota. Each update is O(1): no scan per step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class TenantBlocks:
    count: dict[str, int] = field(default_factory=dict)  # tenant -> blocks held + cached (no zero entries)
    quota: dict[str, int] = field(default_factory=dict)  # tenant -> its quota in blocks (tenants with one)
    over: set[str] = field(default_factory=set)  # tenants whose count exceeds their quota
    cached: dict[str, OrderedDict[int, None]] = field(default_factory=dict)  # tenant -> its evictable block ids

    def set_quota(self, tenant: str, blocks: int | None) -> None:
        """The tenant's quota as its latest request carries it (None: none)."""
        if blocks is None:
            if self.quota.pop(tenant, None) is not None:
                self.over.discard(tenant)
            return
        self.quota[tenant] = blocks
        self._update_over(tenant)

    def add(self, tenant: str) -> None:
        self.count[tenant] = self.count.get(tenant, 0) + 1
        self._update_over(tenant)

    def remove(self, tenant: str) -> None:
        left = self.count[tenant] - 1
        if left:
            self.count[tenant] = left
        else:
            del self.count[tenant]
            self.quota.pop(tenant, None)  # nothing of it left to judge; its next request brings the quota again
        self._update_over(tenant)

    def is_over(self, tenant: str) -> bool:
        return tenant in self.over

    def push_cached(self, tenant: str, block_id: int) -> None:
        """An owned keyed block became unreferenced: it is evictable, after the tenant's earlier ones."""
        self.cached.setdefault(tenant, OrderedDict())[block_id] = None

    def drop_cached(self, tenant: str, block_id: int) -> None:
        """The cached block was referenced again (a hit) or evicted."""
        queue = self.cached[tenant]
        del queue[block_id]
        if not queue:
            del self.cached[tenant]

    def over_quota_victim(self) -> int | None:
        """The first block to evict for quotas: the least recently freed cached block of the tenant furthest over
        its quota (by count / quota) that has one; None when no over-quota tenant has a cached block."""
        candidates = [t for t in self.over if t in self.cached]
        if not candidates:
            return None
        tenant = max(candidates, key=lambda t: (self.count[t] / self.quota[t], t))
        return next(iter(self.cached[tenant]))

    def _update_over(self, tenant: str) -> None:
        quota = self.quota.get(tenant)
        if quota is not None and self.count.get(tenant, 0) > quota:
            self.over.add(tenant)
        else:
            self.over.discard(tenant)
