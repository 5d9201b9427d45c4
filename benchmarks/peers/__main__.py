"""`python -m pagedserve.benchmarks.peers`: start each server in turn, run the standard suite against it, stop it,
compare.

    python -m pagedserve.benchmarks.peers --servers pagedserve                          # make bench
    python -m pagedserve.benchmarks.peers --servers pagedserve,llama.cpp,transformers   # make bench-peers
    python -m pagedserve.benchmarks.peers --servers pagedserve,llama.cpp --gguf m.gguf  # both serve this file

Prompts per point: --num-prompts when > 0, else max(--min-prompts, --prompts-per-concurrency x concurrency), by
default 8, 8, 16, 64 for concurrencies 1, 4, 16, 64: every point fills its concurrency at least once, and the whole
suite takes roughly 20-25 minutes for pagedserve on 2 CPU cores (--prompts-per-concurrency 2: two waves, ~2x).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from pagedserve.benchmarks.peers.machine_speed import MachineSpeed, measure_speed, save_speeds
from pagedserve.benchmarks.peers.plan import SuitePlan, parse_ints
from pagedserve.benchmarks.peers.ratios import comparison
from pagedserve.benchmarks.peers.results import write_server_results
from pagedserve.benchmarks.peers.run import ServerRun, bench_server
from pagedserve.benchmarks.peers.servers import (
    LLAMA_SPEC_ARGS,
    SERVER_KINDS,
    ServerOptions,
    default_llama_threads,
    server_kinds,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.peers", description=__doc__.splitlines()[0])
    p.add_argument("--servers", default="pagedserve", help=f"comma list of {', '.join(SERVER_KINDS)}")
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--out-dir", default="bench-results")
    p.add_argument("--peers-dir", default=".peers", help="git-ignored: the llama.cpp build and the GGUF")
    p.add_argument("--gguf", default=None,
                   help="a GGUF file that pagedserve and llama-server both serve (MODEL_DIR still gives the "
                        "tokenizer that sizes prompts); default: pagedserve serves MODEL_DIR, llama-server the "
                        "default model's GGUF")
    p.add_argument("--concurrencies", default="1,4,16,64")
    p.add_argument("--pagedserve-concurrencies", default="", help="extra points for pagedserve only, e.g. 64")
    p.add_argument("--workloads", default="random,shared-prefix")
    p.add_argument("--num-prompts", type=int, default=0, help="per point; 0: max(min, per-concurrency x c)")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--prompts-per-concurrency", type=int, default=1)
    p.add_argument("--num-warmups", type=int, default=2, help="after each server start, per workload")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="run the servers in turn this many times and pool each point's rounds: the machine's drift "
                        "in speed then falls on every server alike")
    p.add_argument("--llama-ctx-per-slot", type=int, default=2048, help="llama-server -c = slots x this")
    p.add_argument("--threads", default=str(default_llama_threads()),
                   help="llama-server -t; default: cores - 1. A list (1,2) runs llama.cpp once per count, as "
                        "llama.cpp-t1, llama.cpp-t2, and compares pagedserve with the best of them at each point")
    p.add_argument("--build-jobs", type=int, default=2, help="cmake --build -j for llama-server")
    p.add_argument("--speculative-config", default="",
                   help="pagedserve's --speculative-config JSON for the `pagedserve` server (pagedserve-plain runs "
                        "without); e.g. --servers pagedserve,pagedserve-plain,llama.cpp,llama.cpp-spec")
    p.add_argument("--llama-spec-args", default=" ".join(LLAMA_SPEC_ARGS),
                   help="llama-server's speculation flags for the llama.cpp-spec server")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-run", action="store_true", help="only merge the points already under OUT_DIR/raw and compare")
    return p


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _header(runs: list[ServerRun], started: str, speeds: dict[str, MachineSpeed]) -> str:
    lines = [f"started {started}, finished {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, {_load()} at the end"]
    lines += [f"  machine {when}: {speed.line()}" for when, speed in speeds.items()]
    for run in runs:
        status = run.error or ("failed points: " + ", ".join(run.failed_points) if run.failed_points else "ok")
        name = f"{run.label} #{run.round_index + 1}" if len({r.round_index for r in runs}) > 1 else run.label
        lines.append(f"  {name:<13} from {run.started_at}, {run.duration_s / 60:.1f} min, "
                     f"concurrencies {','.join(map(str, run.concurrencies))}: {status}")  # fmt: skip
    return "\n".join(lines)


def _exit_on_signal(signum: int, frame) -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C does, so the `with ServerProcess` blocks stop the running server."""
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    labels = [label.strip() for label in args.servers.split(",") if label.strip()]
    unknown = set(labels) - set(SERVER_KINDS)
    if unknown:
        raise SystemExit(f"unknown servers {sorted(unknown)}; known: {list(SERVER_KINDS)}")
    plan = SuitePlan(
        out_dir=Path(args.out_dir), concurrencies=parse_ints(args.concurrencies),
        own_concurrencies=parse_ints(args.pagedserve_concurrencies),
        workloads=tuple(w for w in args.workloads.split(",") if w), num_prompts=args.num_prompts,
        min_prompts=args.min_prompts, prompts_per_concurrency=args.prompts_per_concurrency,
        num_warmups=args.num_warmups, seed=args.seed, rounds=args.rounds,
    )  # fmt: skip
    llama_threads = parse_ints(args.threads)
    kinds = server_kinds(labels, llama_threads)
    labels = list(kinds)
    gguf = Path(args.gguf).resolve() if args.gguf else None
    if gguf is not None and not gguf.is_file():
        raise SystemExit(f"--gguf {args.gguf}: no such file")
    options = ServerOptions(Path(args.model_dir), Path(args.peers_dir), args.llama_ctx_per_slot, llama_threads[0],
                            args.build_jobs, gguf, args.speculative_config,
                            tuple(shlex.split(args.llama_spec_args)))  # fmt: skip
    started = f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')} ({_load()})"
    runs: list[ServerRun] = []
    speeds = {} if args.no_run else {"before": measure_speed()}  # the machine before the first server
    for round_index in range(0 if args.no_run else plan.rounds):
        runs += [bench_server(kinds[label], options, plan, plan.concurrencies_for(label), round_index)
                 for label in labels]
    for label in labels:
        write_server_results(plan, label, plan.concurrencies_for(label), plot=not args.no_plot)
    if speeds:
        speeds["after"] = measure_speed()
        save_speeds(plan.out_dir / "machine-speed.json", speeds)
    header = _header(runs, started, speeds)
    if len(labels) > 1:
        table = comparison(plan.out_dir, labels, plan.workloads, plot=not args.no_plot)
        path = plan.out_dir / "peers-summary.txt"
        path.write_text(f"{header}\n\n{table}\n")
        print(f"\n{header}\n\n{table}\n\ncomparison: {path}")
    else:
        print(f"\n{header}")
    # peers that fail are reported in the summary; only pagedserve's own failures fail the command
    return 1 if any(run.error or run.failed_points for run in runs if run.label == "pagedserve") else 0


def _unwind_on_signals() -> None:
    """Process-wide, so only the command installs it: a caller running main() in its own process (a test runner)
    keeps its own handlers."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)


if __name__ == "__main__":
    _unwind_on_signals()
    raise SystemExit(main())
