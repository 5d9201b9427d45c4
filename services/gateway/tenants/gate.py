"""The ASGI middleware in front of the endpoints: authenticates the API key to a tenant, enforces the tenant's
per-gateway concurrency and its shared rate limits on generation requests, and counts every request.

Every label value is bounded: the route is a route template or `unmatched` (found by matching the app's routes,
so a 401 or 429 answered before routing counts under its template too), the status a number, the tenant a name
from the keys file. Refusals are OpenAI's: 401 `invalid_api_key`; 429 `rate_limit_exceeded` with Retry-After and
the x-ratelimit-* headers, which admitted generation responses carry as well.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from pagedserve.services.gateway.http.admission import GENERATION_PATHS
from pagedserve.services.gateway.http.errors import OpenAIError, error_response
from pagedserve.services.gateway.http.metrics import GatewayMetrics
from pagedserve.services.gateway.tenants.current import set_current_tenant
from pagedserve.services.gateway.tenants.keys_file import Tenant
from pagedserve.services.gateway.tenants.metrics import TenantMetrics
from pagedserve.services.gateway.tenants.rate_limit import RateDecision, RateLimiter
from pagedserve.services.gateway.tenants.registry import TenantRegistry

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
UNMATCHED = "unmatched"

RouteOf = Callable[[dict], str]  # a request scope -> its route template or UNMATCHED


class TenantGate:
    """Pure ASGI middleware (it leaves `receive` alone, so disconnects stay visible)."""

    def __init__(self, app, registry: TenantRegistry, limiter: RateLimiter, metrics: GatewayMetrics,
                 tenant_metrics: TenantMetrics, route_of: RouteOf) -> None:
        self.app = app
        self.registry = registry
        self.limiter = limiter
        self.metrics = metrics
        self.tenant_metrics = tenant_metrics
        self.route_of = route_of
        self.num_open: Counter[str] = Counter()  # tenant -> generation requests open on this gateway

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tenant = self._tenant(scope)
        if tenant is None:
            await self._refuse(scope, receive, send, OpenAIError(
                401, "Incorrect or missing API key: pass 'Authorization: Bearer <key>'", code="invalid_api_key"))
            return
        set_current_tenant(tenant)
        if scope["path"] not in GENERATION_PATHS:
            await self._serve(scope, receive, send, {})
            return
        if tenant.max_concurrent is not None and self.num_open[tenant.name] >= tenant.max_concurrent:
            self.tenant_metrics.rate_limited.labels(tenant.name, "concurrency").inc()
            await self._refuse(scope, receive, send, OpenAIError(
                429, f"tenant {tenant.name} has {tenant.max_concurrent} requests open, its limit: retry later",
                code="rate_limit_exceeded"))
            return
        decision = await self.limiter.admit(tenant)
        if not decision.allowed:
            self._count_refusal(tenant, decision)
            await self._refuse(scope, receive, send, _rate_limit_error(tenant, decision), decision.headers())
            return
        self.tenant_metrics.requests.labels(tenant.name).inc()
        self.num_open[tenant.name] += 1
        try:
            await self._serve(scope, receive, send, decision.headers())
        finally:
            self.num_open[tenant.name] -= 1

    def _tenant(self, scope) -> Tenant | None:
        if not (self.registry.auth_required and scope["path"].startswith(PROTECTED_PREFIXES)):
            return self.registry.open_tenant
        for name, value in scope["headers"]:
            if name == b"authorization":
                return self.registry.authenticate(value)
        return None

    def _count_refusal(self, tenant: Tenant, decision: RateDecision) -> None:
        for bucket in decision.buckets:
            if bucket.level < 1:
                self.tenant_metrics.rate_limited.labels(tenant.name, bucket.kind).inc()

    async def _refuse(self, scope, receive, send, error: OpenAIError, headers: dict[str, str] | None = None
                      ) -> None:
        self.metrics.http_requests.labels(self.route_of(scope), str(error.status)).inc()
        await error_response(error, headers)(scope, receive, send)

    async def _serve(self, scope, receive, send, headers: dict[str, str]) -> None:
        """Run the app, measuring it and adding `headers` to its response."""
        metrics, start_s, status, first_byte = self.metrics, time.perf_counter(), ["500"], [True]
        extra = [(name.lower().encode(), value.encode()) for name, value in headers.items()]

        async def send_and_measure(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = str(message["status"])
                if extra:
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            elif message["type"] == "http.response.body" and first_byte[0]:
                first_byte[0] = False
                metrics.http_time_to_first_byte.labels(self.route_of(scope)).observe(time.perf_counter() - start_s)
            await send(message)

        metrics.http_requests_in_flight.inc()
        try:
            await self.app(scope, receive, send_and_measure)
        finally:
            metrics.http_requests_in_flight.dec()
            route = self.route_of(scope)
            metrics.http_requests.labels(route, status[0]).inc()
            metrics.http_request_duration.labels(route).observe(time.perf_counter() - start_s)


def _rate_limit_error(tenant: Tenant, decision: RateDecision) -> OpenAIError:
    spent = [b for b in decision.buckets if b.level < 1]
    what = " and ".join(f"{b.kind} per minute (limit {b.limit})" for b in spent) or "its rate limit"
    return OpenAIError(429, f"Rate limit reached for tenant {tenant.name} on {what}; retry after "
                            f"{decision.retry_after_s} s", code="rate_limit_exceeded",
                       retry_after_s=decision.retry_after_s)
