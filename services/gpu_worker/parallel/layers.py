"""The model's tensor-parallel parts: vocabulary-parallel embedding and head, all-reduced row-parallel linears.

A rank's DecoderLM is built from its ShardPlan's local config (its heads, MLP columns, vocabulary rows), so the
column-parallel projections and attention need nothing else; what sums over ranks is added here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.layers.linear import LinearKernel
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup
from pagedserve.services.gpu_worker.parallel.shard_plan import ShardPlan
from pagedserve.services.gpu_worker.step_rows import StepRows


class VocabParallelEmbedding(nn.Module):
    """ids [T] -> [T, hidden]: each rank looks up the ids in its vocabulary rows (zeros for the others), and one
    all-reduce sums the ranks' rows."""

    def __init__(self, plan: ShardPlan, group: TensorParallelGroup) -> None:
        super().__init__()
        c = plan.config
        self.weight = nn.Parameter(torch.empty(plan.vocab_per_rank, c.hidden_size, dtype=c.dtype, device="meta"),
                                   requires_grad=False)
        self.start, self.group = plan.vocab_start, group

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        local = token_ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.group.all_reduce(rows.masked_fill_(outside.unsqueeze(-1), 0))


class AllReduced:
    """A row-parallel linear's kernel: this rank's partial product, summed over the ranks."""

    def __init__(self, kernel: LinearKernel, group: TensorParallelGroup) -> None:
        self.kernel, self.group = kernel, group

    def __call__(self, x: torch.Tensor, rows: StepRows) -> torch.Tensor:
        return self.group.all_reduce(self.kernel(x, rows).contiguous())


class ParallelDecoderLM(DecoderLM):
    """One rank's part of the model: compute_logits returns the whole vocabulary's fp32 logits on rank 0 (the
    sampling rank, gathered there) and None on the others."""

    def __init__(self, plan: ShardPlan, group: TensorParallelGroup, backend: AttentionBackend,
                 max_positions: int) -> None:
        super().__init__(plan.local_config, backend, max_positions)
        self.embed_tokens = VocabParallelEmbedding(plan, group)
        self.group, self.vocab_size = group, plan.config.vocab_size

    def reduce_row_parallel(self) -> None:
        """Wrap the bound kernels of o_proj and down_proj in an all-reduce (after Platform.bind_layers)."""
        for layer in self.layers:
            layer.self_attn.o_proj.kernel = AllReduced(layer.self_attn.o_proj.kernel, self.group)
            layer.mlp.down_proj.kernel = AllReduced(layer.mlp.down_proj.kernel, self.group)

    def compute_logits(self, hidden: torch.Tensor, rows: StepRows) -> torch.Tensor | None:
        parts = self.group.gather_to_leader(self.lm_head(hidden, rows).float())
        return None if parts is None else torch.cat(parts, dim=-1)[:, :self.vocab_size]
