"""The default model's tokenizer, loaded once for the gateway unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.services.gateway.text.tokenizer import PromptTokenizer

MODEL_DIR = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def tokenizer() -> PromptTokenizer:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        raise RuntimeError(f"{MODEL_DIR} is missing: run `make model`")
    return PromptTokenizer(str(MODEL_DIR))
