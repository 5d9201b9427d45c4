"""Redis key names of one scheduler instance: written by the scheduler, read by the gateways' routers.

  pagedserve:{instance}:request:{req_id}   hash    status, times, token counts (observability)
  pagedserve:{instance}:stats              hash    load: num_running, num_waiting, kv_usage, ...
  pagedserve:{instance}:prefix_blocks      set     hex keys of the full blocks the instance's cache holds
  pagedserve:{instance}:prefix_events      stream  the changes to prefix_blocks, in order (see PrefixEvent)
  pagedserve:{instance}:unique_scratch     set     written and deleted in one MULTI/EXEC by the instance's own
                                                   overlap count (services/scheduler/cluster): never seen by others
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SNAPSHOT, DELTA = "snapshot", "delta"  # PrefixEvent.op


def key_prefix(instance_id: str) -> str:
    return f"pagedserve:{instance_id}:"


def stats_key(instance_id: str) -> str:
    return key_prefix(instance_id) + "stats"


def prefix_blocks_key(instance_id: str) -> str:
    return key_prefix(instance_id) + "prefix_blocks"


def prefix_events_key(instance_id: str) -> str:
    return key_prefix(instance_id) + "prefix_events"


def unique_scratch_key(instance_id: str) -> str:
    return key_prefix(instance_id) + "unique_scratch"


PREFIX_BLOCKS_PATTERN = prefix_blocks_key("*")  # SCAN MATCH pattern of every instance's prefix_blocks


def instance_of_prefix_blocks_key(key: str) -> str:
    """The instance id in a prefix_blocks key (the inverse of prefix_blocks_key)."""
    return key.removeprefix("pagedserve:").removesuffix(":prefix_blocks")


@dataclass(frozen=True)
class PrefixEvent:
    """One entry of prefix_events, written in the same MULTI/EXEC as the matching change to prefix_blocks.

    seq counts the publisher's entries (1, 2, ...): a reader that sees a gap, or a snapshot (the set was replaced
    wholesale: the publisher restarted, or lost writes while Redis was away), reads the whole set again."""

    seq: int
    op: str  # SNAPSHOT or DELTA
    added: tuple[str, ...] = ()  # hex keys (a delta only)
    removed: tuple[str, ...] = ()

    def to_fields(self) -> dict[str, str]:
        return {"seq": str(self.seq), "op": self.op, "added": ",".join(self.added), "removed": ",".join(self.removed)}

    @classmethod
    def from_fields(cls, fields: dict[Any, Any]) -> PrefixEvent:
        text = {_str(k): _str(v) for k, v in fields.items()}
        return cls(int(text["seq"]), text["op"], _split(text.get("added", "")), _split(text.get("removed", "")))


def _str(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split(",")) if text else ()
