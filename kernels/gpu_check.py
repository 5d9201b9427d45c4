"""One-command GPU check: kernel tests compiled natively, the engine's Triton check, and a benchmark vs SDPA.

Usage: python -m kernels.gpu_check [--skip-tests] [--skip-bench] [--tiny]
--tiny runs the benchmark code on a few small shapes; with TRITON_INTERPRET=1 it also runs on CPU (for CI).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNEL_TESTS = REPO_ROOT / "tests" / "kernels"
ENGINE_TESTS = REPO_ROOT / "tests" / "unit" / "gpu_worker"
TESTS_TIMEOUT_S = 240
# Scaled error vs SDPA: both round P and the output to bf16 (unit roundoff u = 2**-8), bounded by ~2u(|out| + max|v|)
# / (1 + |out|) < 9u for randn values; 8u leaves room since typical errors are far below the bound.
MAX_BF16_ERR = 8 * 2**-8
TINY_DECODE_SIZES = [(2, 64), (3, 320)]
TINY_PREFILL_SIZES = [(2, 48)]


def _pytest(args: list[str], interpret: bool) -> int:
    """Run pytest in a fresh process (triton picks interpreter or compiler at import) and return its exit code."""
    if importlib.util.find_spec("pytest") is None:
        print("pytest is not installed for this python: cannot run the tests", flush=True)
        return 1
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    print("$", " ".join(cmd), flush=True)
    try:
        return subprocess.run(cmd, cwd=REPO_ROOT, env=env, timeout=TESTS_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        print(f"pytest timed out after {TESTS_TIMEOUT_S} s", flush=True)
        return 1


def run_kernel_tests(interpret: bool) -> int:
    """tests/kernels against the torch reference, natively compiled unless `interpret`; the C kernels' modules
    (test_cpu_*, test_weight_grid: CPU code with CPU-only test dependencies) are left to the CPU suite."""
    cpu_only = ["--ignore-glob=*/test_cpu_*.py", f"--ignore={KERNEL_TESTS / 'test_weight_grid.py'}"]
    return _pytest([str(KERNEL_TESTS), *cpu_only], interpret)


def run_engine_triton_check(interpret: bool) -> int:
    """The engine's forward through the Triton backend: `-k triton` over the tests/unit/gpu_worker modules that
    name it (the others import service dependencies, gRPC health and xgrammar, a bare CUDA image may lack)."""
    modules = sorted(str(path) for path in ENGINE_TESTS.glob("test_*.py") if "triton" in path.read_text())
    if not modules:
        print(f"engine check: no module in {ENGINE_TESTS.relative_to(REPO_ROOT)} names triton", flush=True)
        return 1
    return _pytest([*modules, "-k", "triton"], interpret)


def run_bench(tiny: bool, device: torch.device) -> int:
    """Print the decode/prefill table; fails when Triton and SDPA disagree beyond bf16 rounding."""
    from kernels.attention_bench import (
        DECODE_SIZES,
        PREFILL_SIZES,
        TABLE_HEADER,
        BenchShape,
        run_benchmarks,
    )

    shape = BenchShape(num_heads=4, num_kv_heads=2, head_dim=64) if tiny else BenchShape()
    print(f"\nbenchmark on {device} ({shape}); SDPA runs on dense, unpaged K/V", flush=True)
    print(TABLE_HEADER, flush=True)
    rows = run_benchmarks(shape, TINY_DECODE_SIZES if tiny else DECODE_SIZES,
                          TINY_PREFILL_SIZES if tiny else PREFILL_SIZES, device)
    bad = [row for row in rows if not row.max_err <= MAX_BF16_ERR]
    for row in bad:
        print(f"MISMATCH: {row.kind} batch={row.batch} context={row.context} scaled err {row.max_err:.3e}")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    """Run the enabled steps in order and report each; the exit code is non-zero when any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tests", action="store_true", help="skip tests/kernels and the engine check")
    parser.add_argument("--skip-bench", action="store_true", help="skip the benchmark table")
    parser.add_argument("--tiny", action="store_true", help="benchmark a few small shapes only")
    args = parser.parse_args(argv)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        print("gpu_check needs a CUDA device (or TRITON_INTERPRET=1 with --tiny for a CPU dry run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if interpret else "cuda")
    steps = {}
    if not args.skip_tests:
        steps["kernel tests"] = lambda: run_kernel_tests(interpret)
        steps["engine triton check"] = lambda: run_engine_triton_check(interpret)
    if not args.skip_bench:
        steps["benchmark"] = lambda: run_bench(args.tiny or interpret, device)
    results = {}
    for name, step in steps.items():
        start = time.perf_counter()
        results[name] = (step(), time.perf_counter() - start)
    print("\nsummary:")
    for name, (code, seconds) in results.items():
        print(f"  {name:<22}{'ok' if code == 0 else f'FAILED ({code})':<12}{seconds:>7.1f} s")
    return 0 if all(code == 0 for code, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
