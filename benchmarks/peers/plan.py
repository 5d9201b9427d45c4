"""What the suite runs at each concurrency point: how many prompts and which seed (the same for every server)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SuitePlan:
    out_dir: Path
    concurrencies: tuple[int, ...] = (1, 4, 16, 64)
    own_concurrencies: tuple[int, ...] = ()  # extra points for pagedserve only (peers would take too long there)
    workloads: tuple[str, ...] = ("random", "shared-prefix")
    num_prompts: int = 0  # > 0: this many per point; 0: max(min_prompts, prompts_per_concurrency x concurrency)
    min_prompts: int = 8
    prompts_per_concurrency: int = 1
    num_warmups: int = 2  # after each server start, before its first point of each workload
    seed: int = 0
    rounds: int = 1  # the servers run in turn this many times; a point's rounds are pooled (results.pool_rounds)

    def __post_init__(self):
        if not self.concurrencies or min(self.concurrencies + self.own_concurrencies) < 1:
            raise ValueError("concurrencies must be >= 1")
        if self.num_prompts < 0 or self.min_prompts < 1 or self.prompts_per_concurrency < 1:
            raise ValueError("prompt counts must be positive")
        if self.rounds < 1:
            raise ValueError("rounds must be >= 1")

    def concurrencies_for(self, label: str) -> tuple[int, ...]:
        """The shared points, plus pagedserve's own extra ones (for pagedserve-plain too: its baseline)."""
        extra = self.own_concurrencies if label in ("pagedserve", "pagedserve-plain") else ()
        return tuple(sorted(set(self.concurrencies + extra)))

    def prompts_for(self, concurrency: int) -> int:
        """Default: every point fills its concurrency at least once (one full wave of requests)."""
        return self.num_prompts or max(self.min_prompts, self.prompts_per_concurrency * concurrency)

    def seed_for(self, concurrency: int) -> int:
        """Prompts depend on the concurrency only, so every server sees the same ones at a point. Steps of 10 keep
        the warm-up seed (point seed + 1) clear of every point's seed."""
        return self.seed + 10 * concurrency

    def raw_path(self, label: str, concurrency: int, workload: str, round_index: int = 0) -> Path:
        point = self.out_dir / "raw" / label / f"c{concurrency}"
        return (point / f"round{round_index}" if round_index else point) / f"{label}-{workload}.json"

    def raw_paths(self, label: str, concurrency: int, workload: str) -> list[Path]:
        """The point's result files of every round that left one."""
        paths = (self.raw_path(label, concurrency, workload, r) for r in range(self.rounds))
        return [path for path in paths if path.is_file()]

    def result_path(self, label: str, workload: str) -> Path:
        return self.out_dir / f"{label}-{workload}.json"


def parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(item) for item in text.split(",") if item.strip())
