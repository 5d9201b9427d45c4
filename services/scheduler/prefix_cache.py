"""The key -> block index of cached full blocks, and the keys running requests are still computing.

Keys come from shared/block_hashes.py (the gateway's router computes the same ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.services.scheduler.invariants import require


@dataclass
class PrefixCacheCounters:
    num_queries: int = 0  # prompt tokens looked up
    num_hits: int = 0  # of those, tokens found cached
    num_evictions: int = 0  # cached blocks handed out for new data

    @property
    def hit_rate(self) -> float:
        return self.num_hits / self.num_queries if self.num_queries else 0.0


class PrefixIndex:
    """Key -> block id for cached full blocks. A key maps to at most one block and a block to at most one key.

    With a journal started, every insert and removal is also recorded in order, for a publisher to take (the only
    per-block cost on the engine's path is a list append); past `limit` records the journal gives up and says so.
    """

    def __init__(self) -> None:
        self._block_of_key: dict[bytes, int] = {}
        self.counters = PrefixCacheCounters()
        self._journal: list[tuple[bytes, bool]] | None = None  # (key, added) since the last take; None: off
        self._journal_limit = 0
        self._journal_overflowed = False

    def __len__(self) -> int:
        return len(self._block_of_key)

    def get(self, key: bytes) -> int | None:
        return self._block_of_key.get(key)

    def insert(self, key: bytes, block_id: int) -> bool:
        """Index a newly full block; False when an equal prefix is already cached in another block."""
        if key in self._block_of_key:
            return False
        self._block_of_key[key] = block_id
        if self._journal is not None:
            self._record(key, True)
        return True

    def remove(self, key: bytes) -> None:
        del self._block_of_key[key]
        self.counters.num_evictions += 1
        if self._journal is not None:
            self._record(key, False)

    def keys(self) -> list[bytes]:
        return list(self._block_of_key)

    def start_journal(self, limit: int) -> None:
        """Record changes from now on (at most `limit` between two takes)."""
        self._journal, self._journal_limit, self._journal_overflowed = [], limit, False

    def take_changes(self) -> list[tuple[bytes, bool]] | None:
        """The changes since the last take, oldest first; None when some were not recorded (journal overflow)."""
        assert self._journal is not None, "start_journal() first"
        changes, overflowed = self._journal, self._journal_overflowed
        self._journal, self._journal_overflowed = [], False
        return None if overflowed else changes

    def _record(self, key: bytes, added: bool) -> None:
        if len(self._journal) >= self._journal_limit:
            self._journal.clear()
            self._journal_overflowed = True
        if not self._journal_overflowed:
            self._journal.append((key, added))


@dataclass
class _Span:
    keys: list[bytes]  # the producer's own key list (it only ever grows)
    next: int  # its first block not computed yet
    end: int  # one past its last full block when it was admitted


class InFlightKeys:
    """Keys of full blocks that running requests are still to compute, each with how many requests compute it."""

    def __init__(self) -> None:
        self._num_producers: dict[bytes, int] = {}
        self._spans: dict[str, _Span] = {}  # req_id -> its blocks still in flight

    def __contains__(self, key: bytes) -> bool:
        return key in self._num_producers

    def __len__(self) -> int:
        return len(self._num_producers)

    @property
    def req_ids(self) -> set[str]:
        return set(self._spans)

    def add(self, req_id: str, keys: list[bytes], start: int) -> None:
        """A request was admitted: keys[start:] (its full blocks past the prefix hit) are now in flight."""
        if start < len(keys):
            self._spans[req_id] = _Span(keys, start, len(keys))
            for key in keys[start:]:
                self._num_producers[key] = self._num_producers.get(key, 0) + 1

    def advance(self, req_id: str, num_computed_blocks: int) -> None:
        """The request's first `num_computed_blocks` blocks are computed: they are no longer in flight."""
        span = self._spans.get(req_id)
        if span is None or num_computed_blocks <= span.next:
            return
        done = min(num_computed_blocks, span.end)
        self._drop(span.keys[span.next:done])
        span.next = done
        if done == span.end:
            del self._spans[req_id]

    def discard(self, req_id: str) -> None:
        """The request finished or was preempted: whatever it had still to compute is no longer in flight."""
        span = self._spans.pop(req_id, None)
        if span is not None:
            self._drop(span.keys[span.next:span.end])

    def next_block(self, req_id: str) -> int | None:
        span = self._spans.get(req_id)
        return None if span is None else span.next

    def check(self) -> None:
        """The producer counts are exactly the spans' keys, and no span is empty."""
        expected: dict[bytes, int] = {}
        for req_id, span in self._spans.items():
            require(span.next < span.end <= len(span.keys), f"request {req_id} has an empty in-flight span")
            for key in span.keys[span.next:span.end]:
                expected[key] = expected.get(key, 0) + 1
        require(expected == self._num_producers, "in-flight producer counts do not match the spans")

    def _drop(self, keys: list[bytes]) -> None:
        for key in keys:
            count = self._num_producers[key] - 1
            if count:
                self._num_producers[key] = count
            else:
                del self._num_producers[key]
