"""`python -m pagedserve.benchmarks.latency.routes MODEL [MODEL ...]`: ways of serving one model (a converted folder,
its GGUF file) side by side, in alternating rounds so that the machine's drift falls on each alike.

Per round and model: `pagedserve serve MODEL` on free ports; the greedy answer to the README's question; one
stream's inter-token latency (breakdown.measure, --num-tokens tokens after a warm-up); the worker's memory (VmRSS,
anonymous and file-backed, from /proc) and what its log says it holds (the C GEMMs' packed weights, the KV cache).

    python -m pagedserve.benchmarks.latency.routes models/SmolLM2-135M-Instruct model.Q4_1.gguf --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from pagedserve.benchmarks.latency import process_cpu
from pagedserve.benchmarks.latency.breakdown import measure
from pagedserve.benchmarks.peers.process import ServerProcess, local_pagedserve_spec

QUESTION = "What is the capital of France?"
_PACKED = re.compile(r"packed \d+ weights for the C GEMMs \((.*)\): (\d+) MiB")
_KV = re.compile(r"KV cache: .*\((\d+) MiB\)")


@dataclass
class RouteRun:
    model: str
    round_index: int
    answer: str
    itl_p50_ms: float
    itl_mean_ms: float
    worker_rss_mib: float
    worker_rss_anon_mib: float
    worker_rss_file_mib: float
    packed_weights_mib: float | None  # the C GEMMs' weights, as the worker logs them (None: not logged)
    packing: str  # how they are packed, e.g. "210 as 4-bit codes x int8 inputs"
    kv_cache_mib: float | None
    file_mib: float | None  # the GGUF file's size, where MODEL is one


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.latency.routes",
                                description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="what `pagedserve serve` takes: a model folder or a .gguf file")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--num-tokens", type=int, default=128, help="output tokens of the measured stream (EOS ignored)")
    p.add_argument("--repeats", type=int, default=2, help="streams measured per round and model")
    p.add_argument("--serve-args", default="", help="extra `pagedserve serve` flags, one shell-quoted string")
    p.add_argument("--out", default="bench-results/routes.json")
    p.add_argument("--log-dir", default="bench-results/logs")
    return p


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of a process in MiB (/proc/PID/status)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def greedy_answer(base_url: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, "max_tokens": 16}
    response = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=120.0, trust_env=False)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"]


def run_route(model: str, round_index: int, args: argparse.Namespace) -> RouteRun:
    log_path = Path(args.log_dir) / f"routes-{Path(model).name}-round{round_index}.log"
    log_path.unlink(missing_ok=True)
    with ServerProcess(local_pagedserve_spec(model, args.serve_args), log_path) as server:
        pids = process_cpu.service_pids(server.process.pid)
        name = server.model_name()
        urls = (server.spec.base_url, server.spec.metrics_url)
        answer = greedy_answer(server.spec.base_url, name)
        asyncio.run(measure(*urls, name, 16, pids))  # warm-up
        runs = [asyncio.run(measure(*urls, name, args.num_tokens, pids)) for _ in range(args.repeats)]
        memory = memory_mib(pids["worker"])
    log = log_path.read_text(errors="replace")
    packed, kv = _PACKED.search(log), _KV.search(log)
    itl = [gap for run in runs for gap in run.itl_s]
    return RouteRun(model, round_index, answer, statistics.median(itl) * 1e3, statistics.fmean(itl) * 1e3,
                    memory["VmRSS"], memory["RssAnon"], memory["RssFile"],
                    float(packed.group(2)) if packed else None, packed.group(1) if packed else "",
                    float(kv.group(1)) if kv else None,
                    Path(model).stat().st_size / 2**20 if model.endswith(".gguf") else None)


def table(runs: list[RouteRun]) -> str:
    lines = ["| model | round | answer | ITL p50 / mean ms | worker RSS (anon + file) MiB | packed weights MiB | "
             "KV cache MiB | file MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {Path(r.model).name} | {r.round_index + 1} | {r.answer!r} | {r.itl_p50_ms:.2f} / "
                     f"{r.itl_mean_ms:.2f} | {r.worker_rss_mib:.0f} ({r.worker_rss_anon_mib:.0f} + "
                     f"{r.worker_rss_file_mib:.0f}) | {r.packed_weights_mib} ({r.packing}) | {r.kv_cache_mib} | "
                     f"{'-' if r.file_mib is None else f'{r.file_mib:.1f}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    runs = [run_route(model, r, args) for r in range(args.rounds) for model in args.models]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"started": started, "runs": [asdict(r) for r in runs]}, indent=1) + "\n")
    print(f"started {started}, finished {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n{table(runs)}\n\nwritten to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
