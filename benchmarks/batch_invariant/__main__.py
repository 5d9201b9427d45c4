"""`python -m pagedserve.benchmarks.batch_invariant`: the price of `--batch-invariant`, against the default, through the
services.

Starts two `pagedserve serve MODEL_DIR` on free ports, one with `--batch-invariant`, and runs the bench
(`pagedserve.benchmarks.cli serve`: random prompts, EOS suppressed) at each stream count in alternating rounds: per
round and
stream count, one mode then the other (the order flips every round), with the same prompts for both, so that both
see the same machine load. Only one server is busy at a time. Writes a JSON summary and a markdown table (output
tok/s over all rounds, the median of the rounds' ITL medians, invariant/default ratios) with the machine's load
(`uptime`) before and after, rewritten after every pair of rounds (`complete`: false until the last), so that a
run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from pagedserve.benchmarks.batch_invariant.summary import MODES, cell, table
from pagedserve.benchmarks.cli import main as bench_main
from pagedserve.benchmarks.peers.process import ServerProcess, local_pagedserve_spec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.batch_invariant",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--streams", default="1,16,64", help="comma list of concurrent streams")
    p.add_argument("--prompts-per-stream", type=int, default=1, help="requests per round: streams x this")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    p.add_argument("--serve-args", default="--kv-cache-memory-bytes 1073741824 --max-queue-wait-s 0",
                   help="`pagedserve serve` flags both servers get, one shell-quoted string (default: no queue-time "
                        "bound, so that a busy machine's slow steps do not refuse streams with 429)")
    p.add_argument("--out", default="bench-results/batch-invariant.json")
    p.add_argument("--log-dir", default="bench-results/logs")
    return p


def bench_round(args: argparse.Namespace, base_url: str, model: str, streams: int, seed: int, name: str,
                result_dir: Path) -> dict:
    """One bench run of streams x prompts-per-stream requests at `streams` concurrency; returns its metrics."""
    argv = ["serve", "--base-url", base_url, "--model", model, "--tokenizer", args.model_dir,
            "--dataset-name", "random", "--num-prompts", str(streams * args.prompts_per_stream),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len), "--ignore-eos",
            "--max-concurrency", str(streams), "--seed", str(seed), "--num-warmups", "2", "--disable-tqdm",
            "--no-server-metrics", "--save-result", "--result-dir", str(result_dir), "--result-filename", name]
    if bench_main(argv) != 0:
        raise RuntimeError(f"the {name} round had failed requests")
    return json.loads((result_dir / name).read_text())["runs"][0]["metrics"]


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_summary(args: argparse.Namespace, rounds: dict[int, dict[str, list[dict]]], header: dict,
                  complete: bool) -> str:
    """The summary of the rounds so far (stream counts both modes have run), to --out and its .md; the table."""
    cells = {s: {mode: cell(runs) for mode, runs in modes.items()} for s, modes in rounds.items()
             if all(modes[mode] for mode in MODES)}
    markdown = table(cells)
    summary = {**header, "load_after": load(), "complete": complete,
               "cells": {s: {mode: vars(c) for mode, c in modes.items()} for s, modes in cells.items()},
               "table": markdown}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown + "\n")
    return markdown


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    streams = [int(s) for s in args.streams.split(",")]
    flags = {"default": args.serve_args, "invariant": f"{args.serve_args} --batch-invariant true"}
    rounds: dict[int, dict[str, list[dict]]] = {s: {mode: [] for mode in MODES} for s in streams}
    header = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "load_before": load(),
              "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
              "model_dir": args.model_dir, "input_len": args.input_len, "output_len": args.output_len,
              "rounds": args.rounds, "prompts_per_stream": args.prompts_per_stream, "serve_args": args.serve_args}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        servers = {mode: stack.enter_context(ServerProcess(local_pagedserve_spec(args.model_dir, flags[mode]),
                                                           Path(args.log_dir) / f"batch-invariant-{mode}.log"))
                   for mode in MODES}
        model = servers["default"].model_name()
        for i in range(args.rounds):
            for s in streams:
                for mode in MODES if i % 2 == 0 else MODES[::-1]:  # same seed for both: the same prompts
                    rounds[s][mode].append(bench_round(args, servers[mode].spec.base_url, model, s, 100 + i,
                                                       f"{mode}-{s}-{i}.json", Path(tmp)))
                write_summary(args, rounds, header, complete=False)
    print(write_summary(args, rounds, header, complete=True))
    print(f"load average (1, 5, 15 min): before {header['load_before']}, after {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
