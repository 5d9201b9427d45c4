"""Compile a C kernel of this folder into a shared library for this machine and load it with ctypes.

Each process compiles once per kernel (well under a second) into a private temporary folder: `-march=native` code
is only valid where it was built, so nothing is cached across machines. The library links OpenMP; torch has
already loaded its own libgomp under the same soname, so the kernel's parallel loops run on torch's threads.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

log = logging.getLogger(__name__)
T = TypeVar("T")
ELEMENT_TYPES = {torch.bfloat16: "bf16", torch.float32: "f32"}  # the kernels' entry-point suffixes
# the attention kernels': (query / output dtype, KV cache dtype) -> suffix (an fp16 cache halves the bytes read)
ATTENTION_TYPES = {(torch.float32, torch.float32): "f32", (torch.bfloat16, torch.bfloat16): "bf16",
                   (torch.float32, torch.float16): "f32_kvf16"}
HERE = Path(__file__).resolve().parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared")


class KernelBuildError(RuntimeError):
    """No C compiler, or the kernel does not compile here."""


def compiler() -> str:
    """$CC, else cc / gcc from PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    raise KernelBuildError("no C compiler found (set CC, or install gcc)")


@functools.cache
def load_kernel(name: str) -> ctypes.CDLL:
    """Build kernels/cpu/<name>.c and load it (once per process)."""
    source = HERE / f"{name}.c"
    with tempfile.TemporaryDirectory(prefix="pagedserve-kernel-") as folder:
        library = Path(folder) / f"{name}.so"
        result = subprocess.run([compiler(), *FLAGS, str(source), "-o", str(library), "-lm"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{source.name} did not compile:\n{result.stderr.strip()}")
        return ctypes.CDLL(str(library))  # stays mapped after the folder is removed (torch, imported above, has
        # already loaded its libgomp, so the kernel shares it)


def bind(library: ctypes.CDLL, symbol: str, argtypes: list, restype=ctypes.c_int):
    """The kernel entry point `symbol` with its C signature set."""
    entry = getattr(library, symbol)
    entry.argtypes, entry.restype = argtypes, restype
    return entry


def built_or_none(what: str, build: Callable[[], T]) -> T | None:
    """build() (which should also try the kernel once), or None with a warning naming `what` when it cannot be built
    or run here: no compiler, a compile error on this platform. Callers then use their torch path."""
    try:
        return build()
    except Exception as exc:
        log.warning("%s is unavailable (%s: %s); using torch", what, type(exc).__name__, exc)
        return None
