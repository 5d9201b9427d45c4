"""Prefix-cache isolation between tenants: the salt the scheduler hashes into a request's first block key.

Every salt a tenant's request carries is prefixed with the tenant's name and a separator no name may contain
(names match keys_file._NAME), so no two tenants share a cached block whatever salts their clients send: a client
that copies another tenant's `cache_salt` still gets its own tenant's entries, and a cross-tenant timing probe
finds only misses. The default tenant (an open gateway, or `--api-key`) without a salt keeps `None`, the shared
unsalted entries it has always used; it is the only tenant of such a gateway.
"""

from __future__ import annotations

from pagedserve.services.gateway.tenants.keys_file import DEFAULT_TENANT, Tenant

SEPARATOR = "\x1f"  # ASCII unit separator: never in a tenant name


def tenant_cache_salt(tenant: Tenant, salt: str | None) -> str | None:
    """The salt sent to the scheduler for `tenant`'s request asking for `salt` (None: the client sent none)."""
    if salt is None and tenant.name == DEFAULT_TENANT:
        return None
    return f"{tenant.name}{SEPARATOR}{salt or ''}"
