from pathlib import Path

import pytest

from pagedserve.benchmarks.tokenizer import BenchTokenizer, load_tokenizer

MODEL_DIR = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def tokenizer() -> BenchTokenizer:
    """The real SmolLM2 tokenizer (`make model` downloads it)."""
    return load_tokenizer(str(MODEL_DIR))
