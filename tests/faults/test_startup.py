"""A KV pool smaller than one request of the full context is refused when the worker starts (exit 2, a line
saying how much memory it needs), instead of reporting ready and then refusing every long request."""

from __future__ import annotations

import subprocess
import sys

from pagedserve.services.ports import free_port
from tests.integration.processes import MODEL_DIR, REPO
from tests.unit.gpu_worker.tiny_models import make_tiny_model


def test_a_pool_smaller_than_the_context_stops_the_worker_at_start(tmp_path):
    make_tiny_model("llama", tmp_path / "tiny")  # 256 tokens of context
    argv = [sys.executable, "-m", "pagedserve.services.gpu_worker", str(tmp_path / "tiny"), "--worker-port",
            str(free_port()),
            "--dtype", "float32", "--kv-cache-dtype", "float32", "--kv-cache-memory-bytes", "32KiB",
            "--torch-compile", "false", "--native-kernels", "false"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "fewer than the context limit of 256" in done.stderr and "--kv-cache-memory-bytes" in done.stderr


def test_a_model_that_does_not_split_over_the_ranks_stops_the_worker_with_one_line(tmp_path):
    """The default model's 9 heads and 3 KV heads do not split over 2 ranks: exit 2 with the reason, no traceback."""
    argv = [sys.executable, "-m", "pagedserve.services.gpu_worker", str(MODEL_DIR), "--worker-port", str(free_port()),
            "--tensor-parallel-size", "2", "--load-format", "dummy"]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "tensor-parallel-size 2 does not divide" in done.stderr and "Traceback" not in done.stderr
