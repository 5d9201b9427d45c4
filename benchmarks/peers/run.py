"""Run the standard suite against one kind of server: start it, one `serve` per (concurrency, workload), stop it."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pagedserve.benchmarks.cli import main as bench_main
from pagedserve.benchmarks.peers.plan import SuitePlan
from pagedserve.benchmarks.peers.process import ServerProcess
from pagedserve.benchmarks.peers.servers import ServerKind, ServerOptions
from pagedserve.benchmarks.report import load_result
from pagedserve.benchmarks.suite import WORKLOADS, serve_argv
from pagedserve.benchmarks.suite import build_parser as suite_parser


@dataclass(frozen=True)
class Target:
    label: str
    base_url: str
    model: str  # the name requests carry (what the server lists first)
    tokenizer: str  # the Hugging Face folder whose tokenizer sizes the prompts, the same for every server
    metrics_url: str | None = None  # the engine's Prometheus /metrics; None: BASE_URL/metrics


@dataclass
class ServerRun:
    label: str
    concurrencies: tuple[int, ...]
    started_at: str = ""
    duration_s: float = 0.0
    failed_points: list[str] = field(default_factory=list)  # "workload@concurrency (why)": no result or failures
    error: str | None = None  # the server could not be built, did not start or died
    round_index: int = 0


def bench_server(
    kind: ServerKind, options: ServerOptions, plan: SuitePlan, concurrencies: tuple[int, ...], round_index: int = 0
) -> ServerRun:
    """Never raises for a server that fails: the run records it and the other servers still run."""
    run = ServerRun(kind.label, concurrencies, time.strftime("%Y-%m-%d %H:%M:%S %Z"), round_index=round_index)
    started_s = time.monotonic()
    try:
        kind.prepare(options)
        groups = [(c,) for c in concurrencies] if kind.restart_per_concurrency else [concurrencies]
        for group in groups:
            suffix = f"-round{round_index}" if round_index else ""
            log_path = plan.out_dir / "logs" / f"{kind.label}-c{'-'.join(map(str, group))}{suffix}.log"
            with ServerProcess(kind.spec(options, max(group)), log_path) as server:
                target = Target(kind.label, server.spec.base_url, server.model_name(), str(options.model_dir),
                                server.spec.metrics_url)
                _run_group(server, target, plan, group, run)
    except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        print(f"[{kind.label}] {run.error}", flush=True)
    run.duration_s = time.monotonic() - started_s
    return run


def _run_group(server: ServerProcess, target: Target, plan: SuitePlan, group: tuple[int, ...], run: ServerRun) -> None:
    warmed: set[str] = set()  # warm-ups only before the first point of each workload after a start
    for concurrency in group:
        for workload in plan.workloads:
            num_warmups = 0 if workload in warmed else plan.num_warmups
            warmed.add(workload)
            print(f"[{target.label}] {workload} at concurrency {concurrency}: {plan.prompts_for(concurrency)} prompts",
                  flush=True)  # fmt: skip
            rc = bench_main(point_argv(target, plan, workload, concurrency, num_warmups, run.round_index))
            problem = point_problem(rc, plan.raw_path(target.label, concurrency, workload, run.round_index))
            if problem:
                run.failed_points.append(f"{workload}@{concurrency} ({problem})")
            if server.process.poll() is not None:
                raise RuntimeError(f"exited with {server.process.returncode} during the run:\n{server.log_tail()}")


def point_problem(rc: int, path: Path) -> str | None:
    """Why a point's numbers cannot be taken at face value: no result, or requests that failed."""
    if rc != 0 or not path.is_file():
        return f"serve exited with {rc}" if rc != 0 else "no result file"
    failed = sum(run["metrics"]["failed"] for run in load_result(path)["runs"])
    return f"{failed} requests failed" if failed else None


def point_argv(target: Target, plan: SuitePlan, workload: str, concurrency: int, num_warmups: int,
               round_index: int = 0) -> list[str]:
    """The suite's own `serve` flags for one workload at one concurrency; plots are drawn after merging."""
    raw = plan.raw_path(target.label, concurrency, workload, round_index)
    args = suite_parser().parse_args([
        "--base-url", target.base_url, "--model", target.model, "--label", target.label,
        "--out-dir", str(raw.parent), "--tokenizer", target.tokenizer, "--concurrencies", str(concurrency),
        "--num-prompts", str(plan.prompts_for(concurrency)), "--seed", str(plan.seed_for(concurrency)),
        "--num-warmups", str(num_warmups), "--no-plot",
    ])  # fmt: skip
    metrics = ["--metrics-url", target.metrics_url] if target.metrics_url else []
    return serve_argv(args, next(w for w in WORKLOADS if w.name == workload), ["--disable-tqdm", *metrics])
