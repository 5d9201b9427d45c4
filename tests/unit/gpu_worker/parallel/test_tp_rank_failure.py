"""A tensor-parallel rank that dies takes the worker process down as a whole, within seconds (no hang on a
half-dead group): the scheduler then sees a worker restart, as after any crash."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

from tests.integration.processes import process_alive
from tests.unit.gpu_worker.parallel.tp_models import make_tp_model

EXIT_WITHIN_S = 10.0
READY_WITHIN_S = 240.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_killing_a_rank_ends_the_worker(tmp_path):
    make_tp_model("llama", tmp_path / "llama")
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "pagedserve.services.gpu_worker", str(tmp_path / "llama"), "-tp", "3", "--dtype",
             "float32",
             "--worker-port", str(_free_port()), "--kv-cache-memory", "8MiB", "--no-torch-compile",
             "--no-native-kernels", "--distributed-timeout-s", "20"],
            stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    try:
        deadline = time.monotonic() + READY_WITHIN_S
        while "worker ready" not in log_path.read_text():
            assert worker.poll() is None, f"worker exited early:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"worker not ready:\n{log_path.read_text()}"
            time.sleep(0.5)
        text = log_path.read_text()
        pids = [int(p) for p in re.search(r"followers pids \[([\d, ]+)\]", text).group(1).split(",")]
        assert len(pids) == 2
        os.kill(pids[1], signal.SIGKILL)
        killed_s = time.monotonic()
        code = worker.wait(timeout=EXIT_WITHIN_S)
        took_s = time.monotonic() - killed_s
    finally:
        if worker.poll() is None:
            worker.kill()
    assert code != 0 and took_s < EXIT_WITHIN_S
    assert "tensor-parallel rank gone: tp-rank-2" in log_path.read_text()
    time.sleep(1.0)
    for pid in pids:  # no orphan rank left behind
        assert not process_alive(pid), f"rank pid {pid} outlived the worker"

