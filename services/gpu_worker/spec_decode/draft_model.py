"""The draft-model proposer: a small model of the target's vocabulary that the worker runs over its own paged KV.

Contract:
- Loaded at start with the target's platform and kernels (`load_draft_model`), refused unless its vocabulary is
  the target's (same size; the same tokens where both folders hold a tokenizer.json).
- Its KV cache has the target's number of blocks and block size and is addressed by the target's block tables:
  block b's shadow holds the draft's keys and values for the positions target block b holds. The scheduler's
  block accounting (reservation of the draft positions, `free_tail` after verification, preemption) thus covers
  the draft KV unchanged, and the worker's `--kv-cache-memory` budget pays for both caches.
- `RequestState.draft_num_computed` positions of a request hold valid draft KV (0 for a new mirror: its first
  draft computes its whole context). `propose` computes the rest of its known tokens in one batched catch-up
  forward, then k - 1 batched one-token forwards over its own drafts, greedy (argmax), and leaves
  draft_num_computed at len(token_ids) + k - 1 (the last draft is never fed). Verification caps it at the
  target's computed tokens (verify_step.py), which drops exactly the positions fed a rejected draft.
- Drafts only decide speed: verification is exact whatever they are (rejection sampling with the greedy draft as
  a point mass q). So a shadow block shared through the prefix cache, rewritten by another request's catch-up with
  the same tokens, can cost acceptance at most, never a wrong token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.kv_cache import KVCache, kv_bytes_per_token
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import ModelConfig, UnsupportedModelError, load_model_config
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.step_rows import KeptRows, StepRows
from pagedserve.services.gpu_worker.worker_config import WorkerConfig

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import ModelForward, Platform


@dataclass
class DraftModel:
    """The loaded draft model, before its KV cache exists (the worker sizes the pool for both models first)."""

    model_dir: str
    model: DecoderLM
    backend: AttentionBackend
    kv_dtype: torch.dtype

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.model.config, self.kv_dtype)


def load_draft_model(model_dir: str, config: WorkerConfig, platform: Platform, target: ModelConfig,
                     target_dir: str, max_model_len: int) -> DraftModel:
    """The draft model on the target's platform, with the worker's dtype and KV dtype rules."""
    mc = load_model_config(model_dir, config.dtype)
    if config.dtype in ("auto", ""):
        mc = replace(mc, dtype=platform.serving_dtype(mc.dtype, model_dir))
    problem = vocabulary_problem(mc, model_dir, target, target_dir)
    if problem is not None:
        raise UnsupportedModelError(f"draft model {model_dir}: {problem}")
    kv_dtype = platform.kv_cache_dtype(config.kv_cache_dtype, mc.dtype)
    shape = AttentionShape(mc.num_heads, mc.num_kv_heads, mc.head_dim, mc.head_dim ** -0.5, mc.sliding_window)
    backend = platform.attention_backend(config.attention_backend, shape, mc.dtype, kv_dtype, config.block_size)
    model = load_model(model_dir, mc, backend, max_model_len, platform, config.load_format)
    return DraftModel(model_dir, model, backend, kv_dtype)


def vocabulary_problem(draft: ModelConfig, draft_dir: str, target: ModelConfig, target_dir: str) -> str | None:
    """Why the draft's token ids would not mean the target's (None: they do)."""
    if draft.vocab_size != target.vocab_size:
        return (f"its vocabulary has {draft.vocab_size} tokens, the target's {target.vocab_size}: a draft model "
                f"must share the target's tokenizer")
    draft_vocab, target_vocab = _tokenizer_vocab(draft_dir), _tokenizer_vocab(target_dir)
    if draft_vocab is not None and target_vocab is not None and draft_vocab != target_vocab:
        return "its tokenizer.json maps tokens to other ids than the target's: a draft model must share its tokenizer"
    return None


def _tokenizer_vocab(model_dir: str) -> tuple[object, object] | None:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens", []))
    return data.get("model", {}).get("vocab"), added


class DraftModelProposer:
    """Proposes a step's drafts for the requests the scheduler gave draft positions (see the module docstring)."""

    def __init__(self, draft: DraftModel, num_blocks: int, block_size: int, platform: Platform) -> None:
        self.model = draft.model
        self.model_dir = draft.model_dir
        self.device = platform.device
        self.kv_cache = KVCache.allocate(draft.model.config, num_blocks, block_size, self.device, draft.kv_dtype)
        self.forward: ModelForward = platform.model_forward(draft.model, draft.backend, self.kv_cache)

    @torch.inference_mode()
    def propose(self, requests: list[RequestState], counts: list[int]) -> None:
        """Set each request's `draft_token_ids` to counts[i] greedy drafts after its last known token."""
        tables = _block_tables(requests)
        starts = [min(r.draft_num_computed, len(r.token_ids) - 1) for r in requests]
        feeds = [r.token_ids[s:] for r, s in zip(requests, starts, strict=True)]
        drafts: list[list[int]] = [[] for _ in requests]
        active = list(range(len(requests)))
        while active:
            chosen = self._next_tokens(tables[active], [starts[i] for i in active], [feeds[i] for i in active])
            still = []
            for i, token in zip(active, chosen, strict=True):
                drafts[i].append(token)
                starts[i] += len(feeds[i])
                feeds[i] = [token]
                if len(drafts[i]) < counts[i]:
                    still.append(i)
            active = still
        for request, tokens, start in zip(requests, drafts, starts, strict=True):
            request.draft_token_ids = tokens
            request.draft_num_computed = start

    def _next_tokens(self, tables: torch.Tensor, starts: list[int], feeds: list[list[int]]) -> list[int]:
        """One draft forward: each request computes its `feeds` from position starts[i]; the argmax after each."""
        order = sorted(range(len(feeds)), key=lambda i: len(feeds[i]) != 1)  # decodes first
        lengths = torch.tensor([len(feeds[i]) for i in order], dtype=torch.long)
        begins = torch.tensor([starts[i] for i in order], dtype=torch.long)
        query_start_loc = torch.zeros(len(order) + 1, dtype=torch.long)
        torch.cumsum(lengths, 0, out=query_start_loc[1:])
        seq_lens = begins + lengths
        request_of_row = torch.repeat_interleave(torch.arange(len(order)), lengths)
        positions = torch.arange(int(query_start_loc[-1])) - query_start_loc[request_of_row] + begins[request_of_row]
        table = tables[order]
        block_size = self.kv_cache.block_size
        slot_mapping = table[request_of_row, positions // block_size].long() * block_size + positions % block_size
        num_decodes = int((lengths == 1).sum())
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(self.device),
            query_start_loc=query_start_loc.to(device=self.device, dtype=torch.int32),
            seq_lens=seq_lens.to(device=self.device, dtype=torch.int32),
            block_tables=table.to(self.device),
            num_decodes=num_decodes,
            max_query_len=int(lengths.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc_cpu=query_start_loc.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )
        rows = StepRows(len(order), num_decodes)
        keep = KeptRows((query_start_loc[1:] - 1).to(self.device), rows)
        token_ids = torch.tensor([t for i in order for t in feeds[i]], dtype=torch.long, device=self.device)
        hidden = self.forward(token_ids, positions.to(self.device), self.kv_cache.layers, meta, keep)
        best = self.model.compute_logits(hidden, rows).argmax(dim=-1).tolist()
        chosen = [0] * len(order)
        for row, i in enumerate(order):
            chosen[i] = best[row]
        return chosen


def _block_tables(requests: list[RequestState]) -> torch.Tensor:
    """[B, max blocks] int32 on the host, padded with block 0 (never read: seq_lens bound every read)."""
    table = torch.zeros(len(requests), max(len(r.block_ids) for r in requests), dtype=torch.int32)
    for i, request in enumerate(requests):
        table[i, :len(request.block_ids)] = torch.tensor(request.block_ids, dtype=torch.int32)
    return table
