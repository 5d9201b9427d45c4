"""`python -m pagedserve.benchmarks.device [--cpu-dry-run] [--results PATH] [--budget-s S]`: issue 38's device checks.

Sections run in priority order, each in a time box (a section stops starting items when its box is spent; a
SIGALRM a little after it stops one stuck inside an item), each printing its rows and rewriting the results file
as it goes: environment and a graph-capture probe (a failed probe skips the graph runs), smoke tests, attention
kernels against SDPA's FLASH and cuDNN backends, the fused layer kernels, the weight-only quantized GEMMs
(int4 / FP8: correctness and their row threshold's timings), the engine on the SmolLM2-135M and
Llama-3.2-1B shapes (dummy weights) with graphs on and off, the transformers StaticCache + CUDA graph baseline,
and the table of the issue's targets. `--cpu-dry-run` runs every section on CPU at toy sizes (TRITON_INTERPRET=1)
to prove the plumbing; what cannot run there at all says `needs cuda`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_BUDGET_S = 480.0  # the 8 minutes for the whole script
GRACE_S = {False: 30.0, True: 5.0}  # after a box, before SIGALRM stops the item still running (cuda, dry run)
MIN_BOX_S = 1.0  # a section with less left of the overall budget is skipped, and says so


class SectionTimeout(Exception):
    pass


def _sections() -> list[tuple[str, Callable, float, float]]:
    """(name, run, box on cuda in s, box in a dry run in s), in priority order; imported after the env is set."""
    from pagedserve.benchmarks.device import (
        attention,
        engine,
        environment,
        fused,
        hf_baseline,
        smoke,
        targets,
        weight_only,
    )

    return [
        ("environment", environment.run, 25, 4),
        ("smoke tests", smoke.run, 90, 35),
        ("attention kernels", attention.run, 100, 8),
        ("fused kernels", fused.run, 25, 5),
        ("weight-only GEMMs", weight_only.run, 25, 3),
        ("engine", engine.run, 150, 15),
        ("transformers baseline", hf_baseline.run, 50, 6),
        ("targets", targets.run, 5, 3),
    ]


def run_section(state, name: str, run: Callable, box_s: float, grace_s: float) -> None:
    """Run one section in its box; its status lands in the results whatever happens inside it."""
    from pagedserve.benchmarks.device.context import Section

    record = state.results.section(name, box_s)
    print(f"\n== {name} (box {box_s:.0f} s)", flush=True)
    start = time.monotonic()
    section = Section(state, name, start + box_s)

    def alarm(signum, frame):
        raise SectionTimeout(f"stopped {grace_s:.0f} s after its {box_s:.0f} s box")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(max(1, int(box_s + grace_s)))
    try:
        status = run(section) or "ok"
    except SectionTimeout as exc:
        status = f"timed out: {exc}"
    except Exception as exc:  # a section's failure is reported and the next one still runs
        status = f"failed: {type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    record.status, record.seconds = status, round(time.monotonic() - start, 2)
    state.results.save()
    print(f"== {name}: {status} ({record.seconds:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="every section on CPU at toy sizes")
    parser.add_argument("--results", type=Path, default=None,
                        help="results JSON (default: $OUT/results.json, else ./gpu-check-results.json)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the whole run's limit")
    args = parser.parse_args(argv)
    # Before the first `import triton`: @triton.jit picks interpreter or compiler when a kernel is defined.
    os.environ["TRITON_INTERPRET"] = "1" if args.cpu_dry_run else "0"
    import torch

    from pagedserve.benchmarks.device.context import RunState
    from pagedserve.benchmarks.device.results import Results, default_results_path

    if not args.cpu_dry_run and not torch.cuda.is_available():
        print("pagedserve.benchmarks.device needs a CUDA device (or --cpu-dry-run)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.cpu_dry_run else "cuda")
    results = Results(args.results or default_results_path(), "cpu-dry-run" if args.cpu_dry_run else "cuda")
    state = RunState(args.cpu_dry_run, device, results)
    print(f"results: {results.path}", flush=True)
    end = time.monotonic() + args.budget_s
    for name, run, box_s, dry_box_s in _sections():
        box_s = min(dry_box_s if args.cpu_dry_run else box_s, end - time.monotonic())
        if box_s < MIN_BOX_S:
            results.section(name, 0).status = "skipped: the run's budget is spent"
            results.save()
            print(f"== {name}: skipped (budget spent)", flush=True)
            continue
        run_section(state, name, run, box_s, GRACE_S[args.cpu_dry_run])
    print("\nsections:")
    for name, record in results.sections.items():
        print(f"  {name:<24}{record.seconds:>7.1f} s  {record.status}")
    failed = [name for name, record in results.sections.items() if record.status.startswith(("failed", "timed"))]
    return 1 if failed else 0
