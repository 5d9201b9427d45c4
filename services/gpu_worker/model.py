"""The decoder-only transformer shared by Llama, Mistral, Qwen2 and Qwen3, over a flattened, unpadded batch.

Projections are fused (q|k|v in one matrix, gate|up in another) so that each layer runs few large matmuls. The
layers hold weights and call the kernels their platform bound at load (platforms/); the step's facts (attention
metadata, which rows are decodes, which rows to keep) come in as arguments.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedserve.services.gpu_worker.attention.backend import UNIT_SCALES, AttentionBackend
from pagedserve.services.gpu_worker.attention.metadata import AttentionMetadata
from pagedserve.services.gpu_worker.layers.activation import ActivationKernel, silu_and_mul
from pagedserve.services.gpu_worker.layers.linear import Linear
from pagedserve.services.gpu_worker.layers.norm import RMSNorm
from pagedserve.services.gpu_worker.layers.rotary import RotaryEmbedding, RotaryKernel, apply_rotary
from pagedserve.services.gpu_worker.model_config import ModelConfig
from pagedserve.services.gpu_worker.step_rows import KeptRows, StepRows

Rope = tuple[torch.Tensor, torch.Tensor]
KVPair = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, config.dtype)
        self.o_proj = Linear(config.q_size, config.hidden_size, config.o_bias, config.dtype)
        self.rotate: RotaryKernel = apply_rotary  # a platform may bind an in-place one at load
        self.kv_scales = UNIT_SCALES  # an fp8 KV cache's k/v scales for this layer (vLLM's default: 1.0)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)

    def forward(self, hidden: torch.Tensor, rope: Rope, kv_cache: KVPair, meta: AttentionMetadata,
                keep: KeptRows | None = None) -> torch.Tensor:
        """Keys and values of every row go to the cache; the output projection runs on `keep` (None: all rows)."""
        c = self.config
        qkv = self.qkv_proj(hidden, meta.rows)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q.reshape(-1, c.head_dim)).view_as(q), self.k_norm(k.reshape(-1, c.head_dim)).view_as(k)
        q, k = self.rotate(q, k, *rope)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.kv_scales).reshape(-1, c.q_size)
        if keep is None:
            return self.o_proj(out, meta.rows)
        return self.o_proj(out[keep.indices], keep.rows)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, config.dtype)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, config.mlp_bias, config.dtype)
        self.act: ActivationKernel = silu_and_mul  # a platform may bind a fused one at load

    def forward(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x, rows)), rows)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.mlp = MLP(config)

    def forward(self, hidden: torch.Tensor, rope: Rope, kv_cache: KVPair, meta: AttentionMetadata,
                keep: KeptRows | None = None) -> torch.Tensor:
        """The layer's output for the `keep` rows of `hidden` (None: all); every row's keys and values are cached."""
        # forward() directly on the per-layer path: no hooks are used, and Module.__call__ costs a few µs a call
        attn = self.self_attn.forward(self.input_layernorm.forward(hidden), rope, kv_cache, meta, keep)
        rows = meta.rows
        if keep is not None:
            hidden, rows = hidden[keep.indices], keep.rows
        normed = self.post_attention_layernorm.forward(attn, residual=hidden)  # hidden += attn, in place
        return hidden + self.mlp.forward(normed, rows)


class DecoderLM(nn.Module):
    """Token ids [T] and positions [T] in, final hidden states [T, hidden] out; logits only where asked."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype, device="meta")
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, config.dtype)  # tied: the embedding's
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions, config.dtype)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVPair],
                meta: AttentionMetadata, keep: KeptRows | None = None) -> torch.Tensor:
        """Final hidden states of the `keep` rows (None: every row). The last layer computes the other rows only
        as far as their keys and values: a prompt's rows before its last need no output projection or MLP there."""
        if keep is not None and keep.rows.num_rows == len(token_ids):
            keep = None  # every row, in order (each request computes one token and samples it): no copy
        hidden = self.embed_tokens(token_ids)
        rope = self.rotary(positions)
        *body, last = zip(self.layers, kv_caches, strict=True)
        for layer, kv_cache in body:
            hidden = layer.forward(hidden, rope, kv_cache, meta)  # see DecoderLayer.forward
        return self.norm(last[0].forward(hidden, rope, last[1], meta, keep))

    def linears(self) -> list[Linear]:
        """Every linear layer, the output head included."""
        return [m for m in self.modules() if isinstance(m, Linear)]

    def compute_logits(self, hidden: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """fp32 logits for rows of final hidden states (`rows`: which of them are decodes)."""
        return self.lm_head(hidden, rows).float()
