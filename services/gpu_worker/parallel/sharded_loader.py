"""Load one rank's part of a Hugging Face safetensors model: each tensor is read through safe_open's get_slice, so
a rank reads (and holds) only its slices, and fused into the rank's ParallelDecoderLM."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pagedserve.services.gpu_worker.attention.backend import AttentionBackend
from pagedserve.services.gpu_worker.checkpoint_keys import to_model_state
from pagedserve.services.gpu_worker.dummy_weights import dummy_state
from pagedserve.services.gpu_worker.loader import checkpoint_files, read_checkpoint
from pagedserve.services.gpu_worker.model_config import UnsupportedModelError
from pagedserve.services.gpu_worker.parallel.group import TensorParallelGroup
from pagedserve.services.gpu_worker.parallel.layers import ParallelDecoderLM
from pagedserve.services.gpu_worker.parallel.shard_plan import ShardPlan

if TYPE_CHECKING:
    from pagedserve.services.gpu_worker.platforms.platform import Platform


def read_shard(model_dir: str | Path, plan: ShardPlan) -> dict[str, torch.Tensor]:
    """This rank's slice of every tensor of every *.safetensors file in the folder."""
    if not checkpoint_files(model_dir):
        raise UnsupportedModelError(f"tensor parallelism loads safetensors checkpoints; none in {model_dir}")
    return read_checkpoint(model_dir, plan.take)


def load_sharded_model(model_dir: str | Path, plan: ShardPlan, group: TensorParallelGroup,
                       backend: AttentionBackend, max_positions: int, platform: Platform,
                       load_format: str = "auto") -> ParallelDecoderLM:
    """This rank's part of the model on the platform's device, bound to the platform's kernels, its row-parallel
    linears all-reduced; `load_format` "dummy": seeded random weights of the part's shape."""
    local = plan.local_config
    model = ParallelDecoderLM(plan, group, backend, max_positions)
    if load_format == "dummy":
        state = dummy_state(model, platform.device, seed=plan.rank)
    else:
        state = {k: v.to(device=platform.device, dtype=local.dtype)
                 for k, v in to_model_state(read_shard(model_dir, plan), local).items()}
    if local.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match {local.architecture}: missing {missing}, unexpected {unexpected}")
    model.rotary.to(platform.device)
    platform.bind_layers(model)
    model.reduce_row_parallel()
    return model.eval()
