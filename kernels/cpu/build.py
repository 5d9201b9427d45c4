"""Compile a C kernel of this folder into a shared library for this machine, cache it on disk, load it with ctypes.

A library is built once per (source, headers, flags, compiler, CPU) and kept in the cache folder under a name that
hashes all of them, so later processes on the same machine load it instead of compiling; `-march=native` code is
only valid where it was built, hence the CPU in the key. Builds go to a temporary name first and are renamed into
place, so processes starting together never load a half-written file. The library links OpenMP; torch has already
loaded its own libgomp under the same soname, so the kernel's parallel loops run on torch's threads.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
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
# PAGEDSERVE_KERNEL_CACHE_DIR: where the built libraries go; it must allow exec mappings (a noexec tmpfs does not)
DEFAULT_CACHE_DIR = Path(os.environ.get("PAGEDSERVE_KERNEL_CACHE_DIR")
                         or Path.home() / ".cache" / "pagedserve" / "kernels")


class KernelBuildError(RuntimeError):
    """No C compiler, or the kernel does not compile here."""


def compiler() -> str:
    """$CC, else cc / gcc from PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    raise KernelBuildError("no C compiler found (set CC, or install gcc)")


@functools.cache
def _compiler_identity(cc: str) -> str:
    result = subprocess.run([cc, "--version"], capture_output=True, text=True)
    return f"{shutil.which(cc)}\n{result.stdout}"


@functools.cache
def _cpu_identity(cpuinfo: str = "/proc/cpuinfo") -> str:
    """What -march=native depends on: the model name and flags of this CPU (the machine type where unreadable)."""
    path = Path(cpuinfo)
    lines = path.read_text().splitlines() if path.is_file() else []
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted) or platform.machine()


def build_key(name: str, cc: str, flags: tuple[str, ...] = FLAGS, folder: Path = HERE) -> str:
    """A hash of everything the library of kernel `name` depends on."""
    digest = hashlib.sha256()
    for path in [folder / f"{name}.c", *sorted(folder.glob("*.h"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update("\0".join([*flags, _compiler_identity(cc), _cpu_identity()]).encode())
    return digest.hexdigest()[:20]


def compile_library(source: Path, library: Path, cc: str, flags: tuple[str, ...] = FLAGS) -> None:
    """Compile `source` into `library`, atomically: the final name appears only once the file is complete."""
    library.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=f".{library.name}.", dir=library.parent)
    os.close(fd)
    try:
        result = subprocess.run([cc, *flags, str(source), "-o", partial, "-lm"], capture_output=True, text=True)
        if result.returncode != 0:
            raise KernelBuildError(f"{source.name} did not compile:\n{result.stderr.strip()}")
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def cached_library(name: str, cache_dir: Path = DEFAULT_CACHE_DIR, flags: tuple[str, ...] = FLAGS) -> Path:
    """The built library of kernels/cpu/<name>.c in `cache_dir`, compiled first if no process built it yet."""
    cc = compiler()
    library = cache_dir / f"{name}-{build_key(name, cc, flags)}.so"
    if not library.is_file():
        log.info("compiling the C kernel %s into %s", name, library)
        compile_library(HERE / f"{name}.c", library, cc, flags)
    return library


@functools.cache
def load_kernel(name: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> ctypes.CDLL:
    """Load kernels/cpu/<name>.c's library (once per process), from the on-disk cache where it is already built.
    A cache folder that cannot be written falls back to a private temporary one (compiled in every process)."""
    try:
        return ctypes.CDLL(str(cached_library(name, cache_dir)))
    except OSError as exc:  # an unwritable cache folder, or a broken file in it
        log.warning("kernel cache %s unusable (%s); compiling %s privately", cache_dir, exc, name)
        with tempfile.TemporaryDirectory(prefix="pagedserve-kernel-") as folder:
            return ctypes.CDLL(str(cached_library(name, Path(folder))))  # stays mapped after the folder goes


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
