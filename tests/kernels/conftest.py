"""Kernel tests: Triton runs in its CPU interpreter unless TRITON_INTERPRET is already set (benchmarks/device: 0)."""

from __future__ import annotations

import ctypes
import os

# Must happen before the first `import triton`: @triton.jit picks interpreter or compiler when a kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
except ImportError as exc:  # a missing triton is a broken environment, never a reason to skip
    raise RuntimeError("tests/kernels need the `triton` package; install the project's dependencies") from exc

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from pagedserve.kernels.cpu.build import FLAGS, cached_library
from pagedserve.kernels.cpu.int8_linear import Int8Linear


@pytest.fixture(scope="session")
def device() -> torch.device:
    """cpu under the interpreter, cuda when compiling natively; fails if the kernels were built the other way."""
    from pagedserve.kernels.paged_decode_attention import _decode_split_kernel

    interpreted = os.environ["TRITON_INTERPRET"] == "1"
    if isinstance(_decode_split_kernel, InterpretedFunction) != interpreted:
        raise RuntimeError("kernels were imported before TRITON_INTERPRET was set; run the suite in a fresh process")
    if not interpreted and not torch.cuda.is_available():
        raise RuntimeError("TRITON_INTERPRET is not 1 but no CUDA device is present")
    return torch.device("cpu" if interpreted else "cuda")


@pytest.fixture(scope="session")
def avx2_kernel(tmp_path_factory: pytest.TempPathFactory) -> Int8Linear:
    """int8_linear.c built without AVX512-VNNI: its AVX2 tiles, whatever this CPU has."""
    folder = tmp_path_factory.mktemp("avx2-kernels")
    return Int8Linear(ctypes.CDLL(str(cached_library("int8_linear", folder, (*FLAGS, "-mno-avx512vnni")))))
