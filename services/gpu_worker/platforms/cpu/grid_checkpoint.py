"""Whether a checkpoint's linear weights are exact 4-bit grids (a GGUF Q4-style model converted to fp32)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from pagedserve.kernels.cpu.int8_linear import supports
from pagedserve.kernels.cpu.weight_grid import find_grid

_PROBED = ("q_proj.weight", "gate_proj.weight", "qkv_proj.weight")


def first_linear_weight(model_dir: str | Path) -> torch.Tensor | None:
    """The first attention or MLP projection weight in the folder's safetensors, or None."""
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            name = next((key for key in f.keys() if key.endswith(_PROBED)), None)
            if name is not None:
                return f.get_tensor(name)
    return None


def has_4bit_grid_weights(model_dir: str | Path) -> bool:
    """True when the first projection is an fp32 tensor the int8 kernel takes as a 4-bit grid (one probe stands
    for the checkpoint: a converter writes every projection the same way)."""
    weight = first_linear_weight(model_dir)
    return weight is not None and weight.dtype == torch.float32 and supports(find_grid(weight))
