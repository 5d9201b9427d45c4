"""Tenants on one saturated engine: fair share between equal tenants, and priority-0 TTFT under a priority-10
flood (`make bench-tenants`; docs/tenants.md)."""
