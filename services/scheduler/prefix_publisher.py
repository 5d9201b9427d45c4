"""Turns the prefix index's journal into the Redis writes that keep `prefix_blocks` equal to the real cache.

Each publish is one PrefixEvent: a delta (keys added and removed since the last publish, each key by its last
change only) or a snapshot (the whole set, replacing the old one). A snapshot goes out first,
whenever the index is a new one (the engine started over after losing its worker), when the journal overflowed,
and after any publish was lost (Redis down or slow): the published copy can then differ from the cache, and only
a snapshot makes it equal again. One also goes out every `snapshot_interval_s`, which bounds how long a loss
nobody noticed (a Redis failover to a replica that missed the last writes) can leave the copy wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pagedserve.services.scheduler.prefix_cache import PrefixIndex
from pagedserve.shared.replica_keys import DELTA, SNAPSHOT, PrefixEvent

JOURNAL_LIMIT = 200_000  # changes kept between two publishes; more and the next publish is a snapshot


class PrefixPublisher:
    def __init__(self, index_source: Callable[[], PrefixIndex], journal_limit: int = JOURNAL_LIMIT,
                 snapshot_interval_s: float = 60.0) -> None:
        self._index_source = index_source
        self._journal_limit = journal_limit
        self._snapshot_interval_s = snapshot_interval_s
        self._index: PrefixIndex | None = None
        self._needs_snapshot = True
        self._last_snapshot_s = 0.0
        self.seq = 0  # of the last event made

    def next_event(self) -> tuple[PrefixEvent, list[str]] | None:
        """The next event and, for a snapshot, every key of the cache (hex); None when nothing changed."""
        index = self._index_source()
        if index is not self._index:
            self._index = index
            index.start_journal(self._journal_limit)
            self._needs_snapshot = True
        changes = index.take_changes()
        now_s = time.monotonic()
        if changes is None or self._needs_snapshot or now_s - self._last_snapshot_s >= self._snapshot_interval_s:
            self._needs_snapshot, self._last_snapshot_s = False, now_s
            self.seq += 1
            return PrefixEvent(self.seq, SNAPSHOT), [key.hex() for key in index.keys()]
        latest: dict[bytes, bool] = {}  # key -> whether its last change added it
        for key, added in changes:
            latest[key] = added
        if not latest:
            return None
        self.seq += 1
        added = tuple(key.hex() for key, was_added in latest.items() if was_added)
        removed = tuple(key.hex() for key, was_added in latest.items() if not was_added)
        return PrefixEvent(self.seq, DELTA, added, removed), []

    def lost(self) -> None:
        """A publish did not reach Redis (or may not have): the next one is a snapshot."""
        self._needs_snapshot = True
