"""A benchmark's requests by dataset name: synthetic (random, shared-prefix, copy-heavy; datasets.py) or read from files
(sharegpt, custom; dataset_files.py)."""

import numpy as np

from pagedserve.benchmarks.dataset_files import load_custom, load_sharegpt
from pagedserve.benchmarks.datasets import (
    SYNTHETIC_DATASETS,
    BenchRequest,
    DatasetConfig,
    build_copy_heavy,
    build_random,
    build_shared_prefix,
)
from pagedserve.benchmarks.prompts import TokenPool
from pagedserve.benchmarks.tokenizer import BenchTokenizer


def build_dataset(cfg: DatasetConfig, tokenizer: BenchTokenizer | None, seed: int) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    if cfg.name in SYNTHETIC_DATASETS:
        if tokenizer is None:
            raise ValueError(f"--dataset-name {cfg.name} needs a tokenizer: pass --tokenizer (a Hugging Face "
                             "tokenizer folder); the server's /v1/models named no model folder on this machine")
        pool = TokenPool.from_tokenizer(tokenizer)
        build = {"random": build_random, "shared-prefix": build_shared_prefix, "copy-heavy": build_copy_heavy}[cfg.name]
        return build(cfg, tokenizer, pool, rng)
    load = load_sharegpt if cfg.name == "sharegpt" else load_custom
    return load(cfg, tokenizer, rng)
