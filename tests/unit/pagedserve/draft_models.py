"""Draft models for speculative-decoding tests: a tiny random-weight Llama saved to a folder, and the JSON that
points `--speculative-config` at a draft folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(folder: Path, vocab_size: int, seed: int = 0) -> Path:
    """A 2-layer, 64-wide Llama with seeded random weights (its drafts are nearly always rejected)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def draft_model_config(draft_dir: Path, k: int = 4, disable_by_batch_size: int = 0) -> str:
    """Speculation with `draft_dir` as the draft model, always on unless `disable_by_batch_size` says otherwise."""
    return json.dumps({"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k,
                       "disable_by_batch_size": disable_by_batch_size})
