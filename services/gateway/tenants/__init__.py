"""Tenants at the gateway: the keys file (each API key, stored hashed, names a tenant and its limits), its reload
without a restart, the per-tenant rate limits (shared through Redis, per-gateway when Redis is down), the ASGI gate
that authenticates, limits and counts each request, and the per-tenant metrics."""
