"""The tenant of the request being served, set by the tenant gate for the request's task (and the tasks it
starts, such as a streamed body's)."""

from __future__ import annotations

from contextvars import ContextVar

from pagedserve.services.gateway.tenants.keys_file import DEFAULT_TENANT, Tenant

_OPEN = Tenant(DEFAULT_TENANT)
_CURRENT: ContextVar[Tenant] = ContextVar("pagedserve_tenant", default=_OPEN)


def current_tenant() -> Tenant:
    """The request's tenant; the limitless default tenant outside a gated request (tests, no keys)."""
    return _CURRENT.get()


def set_current_tenant(tenant: Tenant) -> None:
    _CURRENT.set(tenant)
