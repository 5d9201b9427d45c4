"""`pagedserve bench serve` (the real CLI, as a subprocess) against the running stack: a small random run, EOS
suppressed, whose saved result must account for every request, token and latency, and the server's counters; the
command as a newcomer types it (model and tokenizer found from the server) succeeds; failed requests exit 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.processes import MODEL_DIR, REPO, Stack

NUM_PROMPTS = 6
TIMEOUT_S = 600  # generous: the machine is shared, and a loaded one compiles and decodes slowly


def bench_command() -> list[str]:
    """The installed `pagedserve` script next to this Python, else the same entry point as a module."""
    script = Path(sys.executable).parent / "pagedserve"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pagedserve.services.cli"]


def run_bench(stack: Stack, model_name: str, out_dir: Path) -> dict:
    argv = [*bench_command(), "bench", "serve", "--base-url", stack.base_url, "--model", model_name,
            "--tokenizer", str(MODEL_DIR), "--dataset-name", "random", "--num-prompts", str(NUM_PROMPTS),
            "--random-input-len", "48", "--random-output-len", "12", "--random-range-ratio", "0.5",
            "--max-concurrency", "2", "--ignore-eos", "--metric-percentiles", "50,90,99", "--metrics-interval", "0.1",
            "--save-result", "--result-dir", str(out_dir), "--result-filename", "bench.json", "--label", "itest",
            "--metrics-url", stack.scheduler_metrics_url, "--disable-tqdm"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"bench exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Serving Benchmark Result" in done.stdout
    return json.loads((out_dir / "bench.json").read_text())


def test_bench_serve_cli_records_every_request(stack: Stack, model_name: str, tmp_path: Path) -> None:
    result = run_bench(stack, model_name, tmp_path)
    contract, (run,) = result["contract"], result["runs"]
    assert contract["label"] == "itest" and contract["sampling"]["ignore_eos"] is True
    assert contract["eos_suppression"] in ("ignore-eos", "logit-bias")

    metrics, requests = run["metrics"], run["requests"]
    assert (metrics["completed"], metrics["failed"], len(requests)) == (NUM_PROMPTS, 0, NUM_PROMPTS)
    assert metrics["max_in_flight"] <= 2
    for request in requests:
        assert request["error"] is None, request
        assert request["num_output_tokens"] == request["num_requested_output_tokens"], request
        assert 6 <= request["num_requested_output_tokens"] <= 18
    assert metrics["num_short_outputs"] == 0
    assert metrics["total_output_tokens"] == sum(r["num_requested_output_tokens"] for r in requests)
    assert metrics["output_throughput_tok_s"] > 0

    for name in ("ttft", "tpot", "itl", "e2el"):
        p50, p90, p99 = (metrics[f"{stat}_{name}_ms"] for stat in ("p50", "p90", "p99"))
        assert 0 < p50 <= p90 <= p99, (name, p50, p90, p99)
        assert metrics[f"median_{name}_ms"] == pytest.approx(p50)
    assert metrics["median_ttft_ms"] <= metrics["median_e2el_ms"]

    server = run["server_metrics"]
    assert server is not None, "no /metrics deltas in the result"
    assert server["prefix_cache_queries"] > 0
    assert 0 <= server["prefix_cache_hits"] <= server["prefix_cache_queries"]


def run_as_typed(stack: Stack, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    """The bench as a newcomer types it: no --model, no --tokenizer, no --ignore-eos, from another folder."""
    argv = [*bench_command(), "bench", "serve", "--base-url", stack.base_url, "--dataset-name", "random",
            "--num-prompts", "16", "--max-concurrency", "4", "--random-input-len", "64", "--random-output-len", "16",
            "--disable-tqdm", *flags]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_bench_as_typed_finds_model_and_tokenizer_and_succeeds(stack: Stack, model_name: str, tmp_path: Path) -> None:
    done = run_as_typed(stack, tmp_path, "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json")
    assert done.returncode == 0, f"bench exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert f"model: {model_name} (the first of the server's /v1/models)" in done.stdout
    assert f"tokenizer: {MODEL_DIR.resolve()} (the model's root" in done.stdout
    assert re.search(r"Successful requests:\s+16\n", done.stdout) and re.search(r"Failed requests:\s+0\n", done.stdout)
    contract = json.loads((tmp_path / "r.json").read_text())["contract"]
    assert contract["sampling"]["ignore_eos"] is True and contract["eos_suppression"] == "ignore-eos"


def test_bench_run_with_failed_requests_exits_1_with_the_count(stack: Stack, tmp_path: Path) -> None:
    done = run_as_typed(stack, tmp_path, "--eos-suppression", "ignore-eos", "--random-output-len", "1000000")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "error: 16 of 16 requests failed (http_400: 16)" in done.stderr
