"""CPU seconds of the processes behind one `pagedserve serve` (and of this process), read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

SERVICES = {"worker": "pagedserve.services.gpu_worker", "scheduler": "pagedserve.services.scheduler",
            "gateway": "pagedserve.services.gateway"}
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (its threads included; exited children not)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime: fields 14 and 15 of stat(5)


def service_pids(serve_pid: int) -> dict[str, int]:
    """The worker, scheduler and gateway started by the `serve` process `serve_pid`, by their `-m` module."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) != serve_pid:
            continue
        for name, module in SERVICES.items():
            if module.encode() in argv:
                found[name] = int(entry.name)
    return found


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each named process and of this one (the client), now."""
    return {**{name: cpu_seconds(pid) for name, pid in pids.items()}, "client": cpu_seconds(os.getpid())}
