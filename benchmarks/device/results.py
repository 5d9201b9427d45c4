"""The results file: rewritten whole after every section and row, so a run cut short still leaves what it had."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_NAME = "gpu-check-results.json"


def default_results_path() -> Path:
    """$OUT/results.json where $OUT is set (the device tool's folder), else ./gpu-check-results.json."""
    out = os.environ.get("OUT")
    return Path(out) / "results.json" if out else Path(DEFAULT_NAME)


@dataclass
class SectionRecord:
    status: str = "running"  # running, ok, failed, timed out, skipped: <why>, needs cuda: <why>
    seconds: float = 0.0
    box_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per measured item, appended as it is measured
    notes: list[str] = field(default_factory=list)


@dataclass
class Results:
    path: Path
    mode: str  # "cuda" or "cpu-dry-run"
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    sections: dict[str, SectionRecord] = field(default_factory=dict)
    targets: list[dict[str, Any]] = field(default_factory=list)

    def section(self, name: str, box_s: float) -> SectionRecord:
        record = self.sections[name] = SectionRecord(box_s=box_s)
        self.save()
        return record

    def add_row(self, name: str, row: dict[str, Any]) -> None:
        """Record and print one measured item of section `name`."""
        self.sections[name].rows.append(row)
        print(f"  [{name}] " + ", ".join(f"{k}={_short(v)}" for k, v in row.items()), flush=True)
        self.save()

    def note(self, name: str, text: str) -> None:
        self.sections[name].notes.append(text)
        print(f"  [{name}] {text}", flush=True)
        self.save()

    def rows(self, name: str) -> list[dict[str, Any]]:
        record = self.sections.get(name)
        return record.rows if record else []

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"mode": self.mode, "started": self.started, "targets": self.targets,
                "sections": {name: vars(record) for name, record in self.sections.items()}}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str))
        tmp.replace(self.path)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
