"""Routing policies side by side on N local replicas: `pagedserve serve --replicas N --routing P` for each policy
(fresh caches, fresh Redis each time), the same shared-prefix workload through `pagedserve bench serve`, one table.

    python -m pagedserve.benchmarks.routing.compare [--replicas 2 --policies prefix,round-robin,least-load]
    # make bench-routing

Columns: the share of prompt tokens served from cache (from the responses' usage), what the gateway had predicted
(its pagedserve_gateway_route_* counters), throughput, time to first token, and how requests spread.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from pagedserve.benchmarks.cli import main as bench_main
from pagedserve.benchmarks.peers.process import ServerProcess, ServerSpec
from pagedserve.benchmarks.prometheus import parse_prometheus_text
from pagedserve.benchmarks.report import load_result
from pagedserve.services.ports import free_port

POLICIES = ("prefix", "round-robin", "least-load")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pagedserve.benchmarks.routing.compare",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--out-dir", default="bench-results/routing")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--num-groups", type=int, default=8, help="distinct shared system prompts")
    p.add_argument("--shared-prefix-len", type=int, default=1000, help="tokens of each shared prompt")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--kv-cache-memory-bytes", default="512MiB", help="each worker's KV pool")
    p.add_argument("--seed", type=int, default=0)
    return p


class LocalRedis:
    """A throw-away redis-server on a free port."""

    def __init__(self, log_path: Path) -> None:
        if shutil.which("redis-server") is None:
            raise SystemExit("redis-server is not installed: run `make redis-server`")
        self.port = free_port()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                             "--save", "", "--appendonly", "no"], stdout=log, stderr=log)
        time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.port), "flushall"], check=True, capture_output=True)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def server_spec(args: argparse.Namespace, policy: str, redis_url: str) -> ServerSpec:
    port = free_port()
    argv = [sys.executable, "-m", "pagedserve.services.cli", "serve", args.model_dir, "--replicas", str(args.replicas),
            "--routing", policy, "--port", str(port), "--scheduler-port", str(free_port()), "--worker-port",
            str(free_port()), "--metrics-port", "0", "--kv-cache-memory-bytes", args.kv_cache_memory_bytes,
            "--redis-url", redis_url]
    return ServerSpec(f"routing-{policy}", argv, port)


def bench_argv(args: argparse.Namespace, base_url: str, model: str, policy: str) -> list[str]:
    return ["serve", "--base-url", base_url, "--model", model, "--tokenizer", args.model_dir,
            "--dataset-name", "shared-prefix", "--num-groups", str(args.num_groups),
            "--shared-prefix-len", str(args.shared_prefix_len), "--shared-prefix-question-len", "30",
            "--shared-prefix-output-len", str(args.output_len), "--shared-prefix-output-range-ratio", "0.5",
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.max_concurrency), "--ignore-eos",
            "--seed", str(args.seed), "--no-server-metrics", "--disable-tqdm", "--save-result",
            "--result-dir", args.out_dir, "--result-filename", f"routing-{policy}.json", "--label", f"routing-{policy}"]


def gateway_counters(base_url: str) -> dict[str, float]:
    """The gateway's routing counters summed over replicas."""
    samples = parse_prometheus_text(httpx.get(base_url + "/metrics", timeout=10).text)
    names = ("pagedserve_gateway_route_predicted_cached_tokens_total", "pagedserve_gateway_route_cached_tokens_total",
             "pagedserve_gateway_route_prompt_tokens_total", "pagedserve_gateway_route_retries_total")
    return {name.removeprefix("pagedserve_gateway_route_"): sum(samples.get(name, [0.0])) for name in names}


def run_policy(args: argparse.Namespace, policy: str, redis: LocalRedis) -> dict:
    redis.flush()
    out_dir = Path(args.out_dir)
    with ServerProcess(server_spec(args, policy, redis.url), out_dir / "logs" / f"routing-{policy}.log") as server:
        rc = bench_main(bench_argv(args, server.spec.base_url, server.model_name(), policy))
        counters = gateway_counters(server.spec.base_url)
    run = load_result(out_dir / f"routing-{policy}.json")["runs"][0]
    return {"policy": policy, "rc": rc, "metrics": run["metrics"], "gateway": counters}


def table(rows: list[dict]) -> str:
    header = (f"{'routing':<12}{'cached %':>9}{'predicted %':>12}{'req/s':>7}{'out tok/s':>10}{'TTFT p50 ms':>12}"
              f"{'TTFT p99 ms':>12}  requests per replica")
    lines = [header]
    for row in rows:
        m, g = row["metrics"], row["gateway"]
        cached = m.get("cached_prompt_tokens_ratio")
        predicted = g["predicted_cached_tokens_total"] / g["prompt_tokens_total"] if g["prompt_tokens_total"] else None
        spread = ", ".join(f"{n}" for n in m.get("requests_per_replica", {}).values())
        lines.append(f"{row['policy']:<12}{_pct(cached):>9}{_pct(predicted):>12}{m['request_throughput_rps']:>7.2f}"
                     f"{m['output_throughput_tok_s']:>10.1f}{m['median_ttft_ms']:>12.0f}{m['p99_ttft_ms']:>12.0f}  "
                     f"{spread}" + (f"  ({m['failed']} failed)" if m["failed"] else ""))
    return "\n".join(lines)


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        raise SystemExit(f"unknown policies {sorted(unknown)}; known: {list(POLICIES)}")
    out_dir = Path(args.out_dir)
    redis = LocalRedis(out_dir / "logs" / "redis.log")
    try:
        rows = [run_policy(args, policy, redis) for policy in policies]
    finally:
        redis.stop()
    summary = (f"{args.replicas} replicas, {args.num_groups} shared prompts of {args.shared_prefix_len} tokens, "
               f"{args.num_prompts} requests at concurrency {args.max_concurrency}, {args.output_len} tokens out\n"
               + table(rows))
    (out_dir / "routing-summary.txt").write_text(summary + "\n")
    print(f"\n{summary}\n\nsummary: {out_dir / 'routing-summary.txt'}")
    return 0 if all(row["rc"] == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
