"""Benchmark requests and their dataset config; the synthetic datasets (random, shared-prefix).

benchmarks/dataset_builder.py picks between these and the file datasets (dataset_files.py)."""

import math
from dataclasses import dataclass, replace

import numpy as np

from pagedserve.benchmarks.copy_heavy import copy_heavy_prompts
from pagedserve.benchmarks.prompts import TokenPool, exact_text, random_text
from pagedserve.benchmarks.tokenizer import BenchTokenizer

DATASET_NAMES = ("random", "shared-prefix", "copy-heavy", "sharegpt", "custom")
# Made-up prompts: a model's answer to them may end at once (EOS), so the bench suppresses EOS for these by
# default, to measure the lengths asked for (--no-ignore-eos lets answers stop where the model ends them).
SYNTHETIC_DATASETS = ("random", "shared-prefix", "copy-heavy")


@dataclass(frozen=True)
class BenchRequest:
    prompt: str  # the user message (chat) or the text after system_prompt (completions)
    num_prompt_tokens: int | None  # dataset-side count of completion_text(); the server's usage overrides it
    num_output_tokens: int  # sent as max_tokens
    system_prompt: str | None = None  # shared-prefix: the group's long shared prompt
    group: int | None = None  # shared-prefix: which shared prompt
    constrained: bool = False  # gets the endpoint's constrained_body (e.g. a response_format) merged in

    def completion_text(self) -> str:
        """The prompt as one string, for the completions endpoint."""
        return self.prompt if self.system_prompt is None else f"{self.system_prompt}\n\n{self.prompt}"


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    num_prompts: int
    path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0  # lengths uniform in [len * (1 - r), len * (1 + r)], as in vllm bench
    random_prefix_len: int = 0  # tokens of one random prefix shared by every random request
    shared_prefix_len: int = 1250
    shared_prefix_question_len: int = 50
    shared_prefix_output_len: int = 128
    shared_prefix_output_range_ratio: float = 0.8  # uneven answers, as in the seed's policy assistant
    num_groups: int = 12
    shared_prefix_seed: int = 0  # the shared prompts' own seed: the same handbooks at every --seed and warm-up
    sharegpt_output_len: int | None = None  # overrides the length of the recorded reply
    custom_output_len: int = 256  # for custom lines without "output_tokens"

    def __post_init__(self):
        if self.name not in DATASET_NAMES:
            raise ValueError(f"--dataset-name must be one of {DATASET_NAMES}, got {self.name!r}")
        if self.num_prompts < 1:
            raise ValueError("--num-prompts must be >= 1")
        for ratio in (self.random_range_ratio, self.shared_prefix_output_range_ratio):
            if not 0.0 <= ratio < 1.0:
                raise ValueError(f"range ratios must be in [0, 1), got {ratio}")
        if self.name in ("sharegpt", "custom") and not self.path:
            raise ValueError(f"--dataset-name {self.name} needs --dataset-path")


def sample_lengths(rng: np.random.Generator, mean_len: int, range_ratio: float, num: int) -> np.ndarray:
    """Integer lengths uniform in [floor(mean * (1 - r)), ceil(mean * (1 + r))], at least 1."""
    # round() first: 300 * (1 - 0.8) is 59.99999999999999 in floating point.
    low = max(1, math.floor(round(mean_len * (1 - range_ratio), 9)))
    high = max(low, math.ceil(round(mean_len * (1 + range_ratio), 9)))
    return rng.integers(low, high + 1, size=num)


def build_random(
    cfg: DatasetConfig, tokenizer: BenchTokenizer, pool: TokenPool, rng: np.random.Generator
) -> list[BenchRequest]:
    input_lens = sample_lengths(rng, cfg.random_input_len, cfg.random_range_ratio, cfg.num_prompts)
    output_lens = sample_lengths(rng, cfg.random_output_len, cfg.random_range_ratio, cfg.num_prompts)
    prefix_ids = pool.sample(rng, cfg.random_prefix_len)
    requests = []
    for input_len, output_len in zip(input_lens.tolist(), output_lens.tolist(), strict=True):
        ids = prefix_ids + pool.sample(rng, input_len)
        text, num_tokens = exact_text(tokenizer, pool, rng, ids, cfg.random_prefix_len + input_len)
        requests.append(BenchRequest(text, num_tokens, output_len))
    return requests


def build_copy_heavy(
    cfg: DatasetConfig, tokenizer: BenchTokenizer, pool: TokenPool, rng: np.random.Generator
) -> list[BenchRequest]:
    """Lengths as for random (--random-input-len / --random-output-len / --random-range-ratio)."""
    input_lens = sample_lengths(rng, cfg.random_input_len, cfg.random_range_ratio, cfg.num_prompts)
    output_lens = sample_lengths(rng, cfg.random_output_len, cfg.random_range_ratio, cfg.num_prompts)
    prompts = copy_heavy_prompts(tokenizer, rng, input_lens.tolist())
    return [BenchRequest(text, num_tokens, output_len)
            for (text, num_tokens), output_len in zip(prompts, output_lens.tolist(), strict=True)]


def build_shared_prefix(
    cfg: DatasetConfig, tokenizer: BenchTokenizer, pool: TokenPool, rng: np.random.Generator
) -> list[BenchRequest]:
    """`num_groups` long shared prompts; each request asks its own question with its own answer length.

    The shared prompts come from `shared_prefix_seed`, not from the point's seed: like a service's system prompts
    they stay the same across a sweep, so a server's prefix cache carries over from one point to the next."""
    prefix_rng = np.random.default_rng(cfg.shared_prefix_seed)
    prefixes = [random_text(tokenizer, pool, prefix_rng, cfg.shared_prefix_len) for _ in range(cfg.num_groups)]
    output_ratio = cfg.shared_prefix_output_range_ratio
    output_lens = sample_lengths(rng, cfg.shared_prefix_output_len, output_ratio, cfg.num_prompts)
    requests = []
    for i, output_len in enumerate(output_lens.tolist()):
        group = i % cfg.num_groups
        question = random_text(tokenizer, pool, rng, cfg.shared_prefix_question_len)
        request = BenchRequest(question, None, output_len, system_prompt=prefixes[group], group=group)
        requests.append(replace(request, num_prompt_tokens=tokenizer.count(request.completion_text())))
    order = rng.permutation(len(requests))  # interleave groups, so the first of each group arrives at a random time
    return [requests[i] for i in order]
