"""Datasets read from files: ShareGPT conversations (JSON or JSONL) and custom JSONL traces."""

import json
import sys
from pathlib import Path

import numpy as np

from pagedserve.benchmarks.datasets import BenchRequest, DatasetConfig
from pagedserve.benchmarks.tokenizer import BenchTokenizer

# vllm bench's ShareGPT filter: drop tiny turns and turns too long for small-context models.
_MIN_TOKENS = 4
_MAX_PROMPT_TOKENS = 1024
_MAX_TOTAL_TOKENS = 2048


def read_json_records(path: str) -> list[dict]:
    """A JSON list, or one JSON object per line."""
    text = Path(path).read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_sharegpt(cfg: DatasetConfig, tokenizer: BenchTokenizer | None, rng: np.random.Generator) -> list[BenchRequest]:
    """First human turn as the prompt; the reply's token count (or --sharegpt-output-len) as the output length."""
    if tokenizer is None and cfg.sharegpt_output_len is None:
        raise ValueError("sharegpt needs --tokenizer or --sharegpt-output-len to know output lengths")
    records = read_json_records(cfg.path)
    requests = []
    for i in rng.permutation(len(records)).tolist():
        turns = records[i].get("conversations") or records[i].get("conversation") or []
        if len(turns) < 2:
            continue
        request = _sharegpt_request(turns[0]["value"], turns[1]["value"], cfg, tokenizer)
        if request is not None:
            requests.append(request)
        if len(requests) == cfg.num_prompts:
            break
    _warn_if_short(requests, cfg)
    return requests


def _sharegpt_request(
    prompt: str, reply: str, cfg: DatasetConfig, tokenizer: BenchTokenizer | None
) -> BenchRequest | None:
    num_prompt_tokens = tokenizer.count(prompt) if tokenizer else None
    num_output_tokens = cfg.sharegpt_output_len or tokenizer.count(reply)
    if cfg.sharegpt_output_len is None and num_output_tokens < _MIN_TOKENS:
        return None
    if num_prompt_tokens is not None and (
        num_prompt_tokens < _MIN_TOKENS
        or num_prompt_tokens > _MAX_PROMPT_TOKENS
        or num_prompt_tokens + num_output_tokens > _MAX_TOTAL_TOKENS
    ):
        return None
    return BenchRequest(prompt, num_prompt_tokens, num_output_tokens)


def load_custom(cfg: DatasetConfig, tokenizer: BenchTokenizer | None, rng: np.random.Generator) -> list[BenchRequest]:
    """Lines of {"prompt": str, "output_tokens": int (optional)}, kept in file order like a trace."""
    requests = []
    for record in read_json_records(cfg.path)[: cfg.num_prompts]:
        prompt = record["prompt"]
        num_output_tokens = int(record.get("output_tokens", cfg.custom_output_len))
        requests.append(BenchRequest(prompt, tokenizer.count(prompt) if tokenizer else None, num_output_tokens))
    _warn_if_short(requests, cfg)
    return requests


def _warn_if_short(requests: list[BenchRequest], cfg: DatasetConfig) -> None:
    if not requests:
        raise ValueError(f"no usable requests in {cfg.path}")
    if len(requests) < cfg.num_prompts:
        print(f"warning: {cfg.path} gave {len(requests)} of {cfg.num_prompts} prompts", file=sys.stderr)
