"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
from pathlib import Path

# Triton kernels run on CPU tensors through the interpreter; it must be chosen before triton is first imported.
# (the device script, benchmarks/device, sets TRITON_INTERPRET=0 explicitly to compile them natively on a GPU.)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

pytest_plugins = ["tests.run_guard"]

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default model converted by `make model`; its absence is a failure, not a skip."""
    if not (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        pytest.fail(f"default model missing at {DEFAULT_MODEL_DIR}: run `make model`", pytrace=False)
    return DEFAULT_MODEL_DIR
