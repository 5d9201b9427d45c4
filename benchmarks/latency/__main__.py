"""`python -m pagedserve.benchmarks.latency`: the per-token time breakdown of one stream (`make bench-latency`).

Starts `pagedserve serve MODEL_DIR` on free ports (extra flags with --serve-args, e.g. "--async-scheduling false"),
streams --repeats completions of --num-tokens tokens one at a time after a warm-up, and prints where each token's
time went (breakdown.py) and the in-process cost of the Python on the stream's path (path_costs.py).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from transformers import AutoTokenizer

from pagedserve.benchmarks.latency import process_cpu
from pagedserve.benchmarks.latency.breakdown import measure, summarize, to_json
from pagedserve.benchmarks.latency.path_costs import path_costs
from pagedserve.benchmarks.peers.process import ServerProcess, local_pagedserve_spec


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.latency", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--num-tokens", type=int, default=256, help="output tokens per stream (EOS ignored)")
    p.add_argument("--repeats", type=int, default=3, help="streams measured, one after another")
    p.add_argument("--serve-args", default="", help="extra `pagedserve serve` flags, one shell-quoted string")
    p.add_argument("--out", default="bench-results/latency.json")
    p.add_argument("--log", default="bench-results/logs/latency-serve.log")
    return p



def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with ServerProcess(local_pagedserve_spec(args.model_dir, args.serve_args), Path(args.log)) as server:
        pids = process_cpu.service_pids(server.process.pid)
        model = server.model_name()
        urls = (server.spec.base_url, server.spec.metrics_url)
        asyncio.run(measure(*urls, model, 32, pids))  # warm-up
        runs = [asyncio.run(measure(*urls, model, args.num_tokens, pids)) for _ in range(args.repeats)]
    breakdown = summarize(runs)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    costs = path_costs(tokenizer, tokenizer.encode(" Once upon a time, in a lighthouse by the sea, there lived an old "
                                                   "keeper who had seen a thousand storms and counted every wave." * 4))
    print(breakdown.table())
    print("\nin-process CPU a token: " + ", ".join(f"{k} {v:.1f}" for k, v in costs.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_json(breakdown, runs, {"serve_args": args.serve_args, "path_costs_us": costs}) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
