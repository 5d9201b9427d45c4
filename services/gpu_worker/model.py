"""The decoder-only transformer shared by Llama, Mistral, Qwen2 and Qwen3, over a flattened, unpadded batch.

Projections are fused (q|k|v in one matrix, gate|up in another) so that each layer runs few large matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.attention.metadata import AttentionMetadata
from services.gpu_worker.layers.norm import RMSNorm
from services.gpu_worker.layers.rotary import RotaryEmbedding
from services.gpu_worker.model_config import ModelConfig


def _linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device="meta")
    layer.requires_grad_(False)
    return layer


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.qkv_proj = _linear(config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, config.dtype)
        self.o_proj = _linear(config.q_size, config.hidden_size, config.o_bias, config.dtype)
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, rotary: RotaryEmbedding,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        c = self.config
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(positions, q, k)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta)
        return self.o_proj(out.reshape(-1, c.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = _linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, config.dtype)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, config.mlp_bias, config.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.mlp = MLP(config)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, rotary: RotaryEmbedding,
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), rotary, kv_cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderLM(nn.Module):
    """Token ids [T] and positions [T] in, final hidden states [T, hidden] out; logits only where asked."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype, device="meta")
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.lm_head = None if config.tie_word_embeddings else _linear(
            config.hidden_size, config.vocab_size, False, config.dtype)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions, config.dtype)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata) -> torch.Tensor:
        hidden = self.embed_tokens(token_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(positions, hidden, self.rotary, kv_cache, meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of final hidden states."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
