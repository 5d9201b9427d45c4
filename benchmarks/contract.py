"""The serving contract saved with every result: what was measured, against what, from which machine."""

import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path


def machine_info() -> dict:
    """The client machine (the server may run elsewhere; its version comes from probe.server_info)."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": _memory_bytes(),
        "python": sys.version.split()[0],
        "packages": {name: _version(name) for name in ("pagedserve", "torch", "aiohttp", "tokenizers", "numpy")},
        "gpus": _gpus(),
    }


def _cpu_model() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpus() -> list[str]:
    """name, driver and memory of each NVIDIA GPU on this machine, if nvidia-smi is installed."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        output = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in output.splitlines() if line.strip()]
