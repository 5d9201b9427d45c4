"""The keys file (`--api-keys-file`, YAML or JSON): tenants, their keys and optional limits.

    {"tenants": {"team-a": {"keys": ["sk-a1"], "rpm": 60, "tpm": 100000, "max_concurrent": 8,
                            "max_tokens": 1024, "models": ["SmolLM2-135M-Instruct"], "priority": 0, "weight": 1,
                            "kv_cache_share": 0.5}}}

Every limit is optional (absent: unlimited). `kv_cache_share` (in (0, 1]) is the tenant's soft quota of each
replica's KV-block pool, held + cached blocks, which the scheduler enforces (services/scheduler/tenant_blocks.py).
Keys are kept only as their SHA-256 digests; no key is ever logged or put in an error message. A key listed under
two tenants is refused (the whole file is).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

DEFAULT_TENANT = "default"  # the tenant of --api-key, and of every request when no key is configured
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # a metric label value and span attribute: short and plain
_LIMITS = {"rpm": int, "tpm": int, "max_concurrent": int, "max_tokens": int, "priority": int, "weight": float,
           "kv_cache_share": float}
_FIELDS = {"keys", "models", *_LIMITS}


class KeysFileError(ValueError):
    """The keys file cannot be read or is malformed; the message never quotes a key."""


@dataclass(frozen=True)
class Tenant:
    name: str
    rpm: int | None = None  # requests per minute (generation requests)
    tpm: int | None = None  # tokens per minute: prompt + generated
    max_concurrent: int | None = None  # generation requests open at once, per gateway
    max_tokens: int | None = None  # the largest `max_tokens` a request may ask for (also its default)
    models: tuple[str, ...] | None = None  # model names it may use; None: any
    priority: int = 0  # its class: the most urgent priority its requests may ask for (lower is sooner, as vLLM)
    weight: float = 1.0  # its share of the engine against other tenants (the scheduler's fair share)
    kv_cache_share: float | None = None  # its soft quota of each replica's KV blocks (held + cached), in (0, 1]

    def clamp_priority(self, requested: int | None) -> int:
        """The request's priority: its own, but never more urgent (lower) than the tenant's class."""
        return self.priority if requested is None else max(requested, self.priority)


def key_digest(key: str | bytes) -> str:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).hexdigest()


@dataclass(frozen=True)
class KeyTable:
    """Key digest -> tenant; `tenants` in file order (the label values of the per-tenant metrics)."""

    by_digest: dict[str, Tenant]
    tenants: tuple[Tenant, ...]

    def lookup(self, key: bytes) -> Tenant | None:
        return self.by_digest.get(key_digest(key))


def single_key_table(api_key: str) -> KeyTable:
    """`--api-key` alone: one tenant, DEFAULT_TENANT, without limits."""
    tenant = Tenant(DEFAULT_TENANT)
    return KeyTable({key_digest(api_key): tenant}, (tenant,))


def load_keys_file(path: str | Path) -> KeyTable:
    """Parse the file (YAML, which JSON is a subset of). Raises KeysFileError naming the tenant and field at fault."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError, json.JSONDecodeError) as exc:
        raise KeysFileError(f"cannot read the keys file {path}: {type(exc).__name__}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tenants"), dict):
        raise KeysFileError(f"{path}: expected a mapping with a 'tenants' mapping")
    by_digest: dict[str, Tenant] = {}
    tenants = []
    for name, entry in data["tenants"].items():
        tenant, keys = _tenant(str(name), entry)
        for key in keys:
            if by_digest.setdefault(key_digest(key), tenant) is not tenant:
                raise KeysFileError(f"{path}: tenant {name!r} lists a key that another tenant (or itself) has")
        tenants.append(tenant)
    return KeyTable(by_digest, tuple(tenants))


def _tenant(name: str, entry: object) -> tuple[Tenant, list[str]]:
    if not _NAME.match(name) or name == DEFAULT_TENANT:
        raise KeysFileError(f"tenant name {name[:64]!r}: use 1-64 letters, digits, '.', '_' or '-' (not "
                            f"{DEFAULT_TENANT!r})")
    if not isinstance(entry, dict):
        raise KeysFileError(f"tenant {name!r}: expected a mapping")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise KeysFileError(f"tenant {name!r}: unknown field(s) {sorted(map(str, unknown))}")
    keys = entry.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
        raise KeysFileError(f"tenant {name!r}: 'keys' must be a non-empty list of strings")
    limits = {}
    for field, kind in _LIMITS.items():
        value = entry.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
            raise KeysFileError(f"tenant {name!r}: {field!r} must be a number, got {type(value).__name__}")
        if field != "priority" and value <= 0:
            raise KeysFileError(f"tenant {name!r}: {field!r} must be positive, got {value}")
        if field == "kv_cache_share" and value > 1:
            raise KeysFileError(f"tenant {name!r}: 'kv_cache_share' is a fraction of the pool, at most 1, got {value}")
        limits[field] = kind(value)
    models = entry.get("models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        raise KeysFileError(f"tenant {name!r}: 'models' must be a list of model names")
    return Tenant(name, models=None if models is None else tuple(models), **limits), keys
