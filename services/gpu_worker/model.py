"""The decoder-only transformer shared by Llama, Mistral, Qwen2 and Qwen3, over a flattened, unpadded batch.

Projections are fused (q|k|v in one matrix, gate|up in another) so that each layer runs few large matmuls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu.decode_layers import DecodeLayers
from kernels.cpu.fused_ops import FusedOps, supports
from services.gpu_worker.attention.backend import AttentionBackend
from services.gpu_worker.attention.metadata import AttentionMetadata
from services.gpu_worker.layers.linear import Projector
from services.gpu_worker.layers.norm import RMSNorm
from services.gpu_worker.layers.rotary import RotaryEmbedding, apply_rotary
from services.gpu_worker.model_config import ModelConfig


def _linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device="meta")
    layer.requires_grad_(False)
    return layer


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, proj: Projector) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.proj = proj
        self.qkv_proj = _linear(config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, config.dtype)
        self.o_proj = _linear(config.q_size, config.hidden_size, config.o_bias, config.dtype)
        self.fused: FusedOps | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, config.dtype)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                keep_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Keys and values of every row go to the cache; the output projection runs on `keep_rows` (None: all)."""
        c = self.config
        qkv = self.proj(hidden, self.qkv_proj)
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.view(-1, c.num_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q.reshape(-1, c.head_dim)).view_as(q), self.k_norm(k.reshape(-1, c.head_dim)).view_as(k)
        if self.fused is not None and supports(q, c.head_dim // 2):
            self.fused.rotary_(q, *rope)  # in place: q and k are this step's own tensors
            self.fused.rotary_(k, *rope)
        else:
            q, k = apply_rotary(q, k, *rope)
        out = self.backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta).reshape(-1, c.q_size)
        if keep_rows is None:
            return self.proj(out, self.o_proj)
        self.proj.keep_rows(keep_rows, meta.num_decodes)  # for this projection, the MLP and the logits
        return self.proj(out[keep_rows], self.o_proj)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, proj: Projector) -> None:
        super().__init__()
        self.proj = proj
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = _linear(config.hidden_size, 2 * config.intermediate_size, config.mlp_bias, config.dtype)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, config.mlp_bias, config.dtype)
        self.fused: FusedOps | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.proj(x, self.gate_up_proj)
        if self.fused is not None and supports(gate_up, self.intermediate_size):
            return self.proj(self.fused.silu_mul(gate_up), self.down_proj)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        return self.proj(F.silu(gate) * up, self.down_proj)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, proj: Projector) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.self_attn = Attention(config, backend, proj)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.mlp = MLP(config, proj)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                keep_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output for `keep_rows` of `hidden` (None: all); every row's keys and values are cached."""
        # forward() directly on the per-layer path: no hooks are used, and Module.__call__ costs a few µs a call
        attn = self.self_attn.forward(self.input_layernorm.forward(hidden), rope, kv_cache, meta, keep_rows)
        if keep_rows is not None:
            hidden = hidden[keep_rows]
        normed = self.post_attention_layernorm.forward(attn, residual=hidden)  # hidden += attn, in place
        return hidden + self.mlp.forward(normed)


class DecoderLM(nn.Module):
    """Token ids [T] and positions [T] in, final hidden states [T, hidden] out; logits only where asked."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend, max_positions: int,
                 proj: Projector | None = None) -> None:
        super().__init__()
        self.config = config
        self.proj = proj or Projector(compile_single_row=False)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype, device="meta")
        self.embed_tokens.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config, backend, self.proj) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.lm_head = None if config.tie_word_embeddings else _linear(
            config.hidden_size, config.vocab_size, False, config.dtype)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions, config.dtype)
        self.decode_layers: DecodeLayers | None = None  # every layer in one C call (CPU; fused_decode.py)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                keep_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states of `keep_rows` (increasing row indices; None: every row). The last layer computes the
        other rows only as far as their keys and values: a prompt's rows before its last need no output projection
        or MLP there."""
        self.proj.decode_step = meta.num_decodes == meta.num_requests
        self.proj.num_decode_rows = meta.num_decodes
        hidden = self.embed_tokens(token_ids)
        rope = self.rotary(positions)
        if keep_rows is not None and len(keep_rows) == len(token_ids):
            keep_rows = None  # every row, in order (each request computes one token and samples it): no copy
        fused = self.decode_layers
        if fused is not None and self.proj.decode_step and kv_caches[0][0].data_ptr() == fused.cache_ptr:
            hidden = self.norm(fused(hidden, *rope, meta.slot_mapping, meta.block_tables, meta.seq_lens))
            return hidden if keep_rows is None else hidden[keep_rows]
        *body, last = zip(self.layers, kv_caches, strict=True)
        for layer, kv_cache in body:
            hidden = layer.forward(hidden, rope, kv_cache, meta)  # see DecoderLayer.forward
        return self.norm(last[0].forward(hidden, rope, last[1], meta, keep_rows))

    def use_fused_ops(self, ops: FusedOps) -> None:
        """Run norms, residual adds, rotary and SiLU-and-multiply in the C kernels (CPU; where shapes allow)."""
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = ops

    def projections(self) -> list[nn.Module]:
        """Every layer that `proj` runs, the output head included."""
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return [m for m in self.layers.modules() if isinstance(m, nn.Linear)] + [head]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits for the given rows of final hidden states."""
        return self.proj(hidden, self.embed_tokens if self.lm_head is None else self.lm_head).float()
