"""The per-token breakdown's arithmetic and its /proc readings."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pagedserve.benchmarks.latency import process_cpu
from pagedserve.benchmarks.latency.breakdown import StreamRun, summarize


def run(itl_ms: list[float], steps: int, step_s: float, sample_s: float, idle_s: float, tokens: int) -> StreamRun:
    return StreamRun(itl_s=[ms / 1e3 for ms in itl_ms], ttft_s=0.1, num_output_tokens=tokens,
                     counters={"steps": steps, "step_s": step_s, "sample_s": sample_s, "idle_s": idle_s},
                     cpu_s={"worker": tokens * 0.02, "gateway": tokens * 0.001, "client": tokens * 0.0005})


def test_per_token_figures_are_medians_over_the_runs_of_per_step_means():
    runs = [run([10, 11, 12], 100, 1.0, 0.1, 0.3, 100), run([20, 21, 22], 100, 1.2, 0.1, 0.2, 100),
            run([30, 31, 90], 50, 0.5, 0.05, 0.2, 50)]
    b = summarize(runs)
    assert b.itl_p50_ms == pytest.approx(21.0) and b.itl_mean_ms == pytest.approx(21.0)
    assert (b.forward_ms, b.sampling_ms, b.worker_wait_ms) == pytest.approx((9.0, 1.0, 3.0))
    assert b.cycle_ms == pytest.approx(13.0)
    assert b.cpu_ms == pytest.approx({"worker": 20.0, "gateway": 1.0, "client": 0.5})
    assert "| = worker cycle | 13.00 |" in b.table()


def test_cpu_seconds_count_this_process_and_the_services_are_found_by_module():
    before = process_cpu.cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    assert process_cpu.cpu_seconds(os.getpid()) >= before + 0.03
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', '-m', m])\n"
        "        for m in ('pagedserve.services.gateway', 'pagedserve.services.gpu_worker')]\n"
        "time.sleep(30)\n")])
    try:
        for _ in range(100):
            found = process_cpu.service_pids(parent.pid)
            if len(found) == 2:
                break
            time.sleep(0.05)
        assert sorted(found) == ["gateway", "worker"]
        assert set(process_cpu.snapshot(found)) == {"gateway", "worker", "client"}
    finally:
        for pid in process_cpu.service_pids(parent.pid).values():
            os.kill(pid, 9)
        parent.kill()
        parent.wait()
