"""Per-tenant Prometheus series. Label values are tenant names from the keys file (or `default`) and fixed words
only, so a client cannot add a series: the set grows only when an operator adds a tenant."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

LIMIT_KINDS = ("requests", "tokens", "concurrency")


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("pagedserve_gateway_tenant_requests", "generation requests admitted, by tenant",
                                ["tenant"], registry=registry)
        self.tokens = Counter("pagedserve_gateway_tenant_tokens",
                              "tokens served, by tenant and kind (prompt, generated; cached: prompt tokens "
                              "served from the prefix cache)", ["tenant", "kind"],
                              registry=registry)
        self.rate_limited = Counter("pagedserve_gateway_tenant_rate_limited",
                                    "requests refused (429) by a tenant limit, by tenant and limit "
                                    "(requests, tokens, concurrency)", ["tenant", "limit"], registry=registry)
        self.limits_shared = Gauge("pagedserve_gateway_rate_limits_shared",
                                   "1 while tenant rate limits are shared through Redis; 0 while each gateway "
                                   "enforces them alone (no Redis URL, or Redis unreachable)", registry=registry)

    def declare(self, tenant_names: tuple[str, ...]) -> None:
        """Create the tenants' series at 0 (a dashboard shows a quiet tenant as 0, not as missing)."""
        for name in tenant_names:
            self.requests.labels(name)
            for kind in ("prompt", "generated", "cached"):
                self.tokens.labels(name, kind)
            for limit in LIMIT_KINDS:
                self.rate_limited.labels(name, limit)
