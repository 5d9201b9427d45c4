"""Each tenant's recent service: tokens computed for it, decayed per step, over its weight.

A tenant's share is `service / weight`; among requests of one priority the queue serves the tenant of the smallest
share first and preemption takes from the largest, so a tenant that floods the queue is served no more than its
weight's part while another is backlogged, and takes all the capacity once alone. Service is charged when a step
is planned (the tokens it computes), so several admissions in one step already alternate between tenants.

The decay is per step (not per second), so the order depends on what was computed, never on the machine's speed:
after `n` steps a token counts `decay ** n`; tenants whose service decayed below `FORGET_BELOW` are dropped, so the
table holds only the tenants served recently. Decay is applied lazily (on read or charge), so a step costs O(1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_DECAY = 0.99  # per step: a token counts for about 100 steps
FORGET_BELOW = 1e-3  # decayed service under this is dropped with the tenant's entry


@dataclass
class TenantService:
    tokens: float = 0.0  # decayed tokens computed, as of step `as_of_step`
    as_of_step: int = 0
    weight: float = 1.0  # the tenant's part of the capacity relative to others (default 1)


@dataclass
class FairShare:
    decay: float = DEFAULT_DECAY
    step: int = 0  # steps planned so far
    tenants: dict[str, TenantService] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")

    def advance(self) -> None:
        """One step was planned: all service so far decays by `decay`."""
        self.step += 1
        if self.step % 256 == 0:
            self._forget_idle()

    def charge(self, tenant: str, num_tokens: int, weight: float = 1.0) -> None:
        """The step being planned computes `num_tokens` tokens for the tenant, whose weight is `weight` (> 0; each
        request carries its tenant's, the latest charged wins)."""
        entry = self._entry(tenant)
        entry.tokens += num_tokens
        entry.weight = weight

    def share(self, tenant: str) -> float:
        """The tenant's decayed service over its weight (0 for a tenant not served recently)."""
        entry = self.tenants.get(tenant)
        return 0.0 if entry is None else self._decayed(entry) / entry.weight

    def _entry(self, tenant: str) -> TenantService:
        entry = self.tenants.get(tenant)
        if entry is None:
            entry = self.tenants[tenant] = TenantService(as_of_step=self.step)
        else:
            entry.tokens, entry.as_of_step = self._decayed(entry), self.step
        return entry

    def _decayed(self, entry: TenantService) -> float:
        return entry.tokens * self.decay ** (self.step - entry.as_of_step)

    def _forget_idle(self) -> None:
        for tenant in [t for t, e in self.tenants.items() if self._decayed(e) < FORGET_BELOW]:
            del self.tenants[tenant]
