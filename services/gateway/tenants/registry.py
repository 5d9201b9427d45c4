"""The tenants this gateway knows: from --api-keys-file (reloaded when the file changes), --api-key, or none.

The file's modification time is polled off the request path (`watch`); a change that parses replaces the table
at once, one that does not is logged (never with a key) and the previous table stays in force. The key check on
the request path is one SHA-256 and one dict lookup.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from pagedserve.services.gateway.tenants.keys_file import (
    DEFAULT_TENANT,
    KeysFileError,
    KeyTable,
    Tenant,
    load_keys_file,
    single_key_table,
)

log = logging.getLogger(__name__)


class TenantRegistry:
    def __init__(self, keys_file: str = "", api_key: str | None = None, poll_interval_s: float = 1.0) -> None:
        """Raises KeysFileError when the keys file is bad at start (a gateway must not start open by mistake)."""
        self.keys_file = keys_file
        self.poll_interval_s = poll_interval_s
        self.on_reload: list[Callable[[KeyTable], None]] = []
        self._mtime_ns: int | None = None
        self._api_key = api_key
        self.open_tenant = Tenant(DEFAULT_TENANT)  # every request's tenant when no key is needed
        self.table: KeyTable | None = None  # None: no key needed
        if keys_file:
            self.table = self._load()
        elif api_key:
            self.table = single_key_table(api_key)

    @property
    def auth_required(self) -> bool:
        return self.table is not None

    @property
    def tenant_names(self) -> tuple[str, ...]:
        """Every tenant name a metric may carry: the table's, else the open tenant's."""
        return tuple(t.name for t in self.table.tenants) if self.table else (DEFAULT_TENANT,)

    def authenticate(self, authorization: bytes) -> Tenant | None:
        """The tenant of an `Authorization: Bearer KEY` header value; None for a missing or unknown key."""
        if self.table is None:
            return self.open_tenant
        scheme, _, key = authorization.partition(b" ")
        if scheme.lower() != b"bearer" or not key:
            return None
        return self.table.lookup(key.strip())

    def _load(self) -> KeyTable:
        """The keys file's table, plus --api-key as the default tenant when both are given."""
        self._mtime_ns = os.stat(self.keys_file).st_mtime_ns
        table = load_keys_file(self.keys_file)
        log.info("keys file %s: %d tenant(s), %d key(s)", self.keys_file, len(table.tenants), len(table.by_digest))
        if not self._api_key:
            return table
        extra = single_key_table(self._api_key)
        return KeyTable({**extra.by_digest, **table.by_digest}, (*table.tenants, *extra.tenants))

    def reload_if_changed(self) -> bool:
        """Reload the keys file when its modification time changed; True when a new table is in force."""
        try:
            if os.stat(self.keys_file).st_mtime_ns == self._mtime_ns:
                return False
            table = self._load()
        except (OSError, KeysFileError) as exc:
            log.error("keys file %s not reloaded, the previous keys stay in force: %s", self.keys_file, exc)
            return False
        self.table = table
        for callback in self.on_reload:
            callback(table)
        return True

    async def watch(self) -> None:
        """Poll the keys file every poll_interval_s (a stat, in a thread: never on the loop); cancel to stop."""
        if not self.keys_file:
            return
        while True:
            await asyncio.sleep(self.poll_interval_s)
            await asyncio.to_thread(self.reload_if_changed)
