"""`--load-format dummy`: seeded random weights for a model's shape, from its config.json alone.

Speed depends on a model's shape, not on its numbers, so a 1B or 8B shape is measurable without its checkpoint.
The weights are built on the device in the serving dtype (bf16 on a GPU, the runtime dtype on CPU); the same
seed, shape, dtype and device give the same weights.
"""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.model import DecoderLM

DUMMY_SEED = 0
INIT_STD = 0.02  # Hugging Face's usual initializer_range: activations and logits stay finite and unremarkable


def dummy_state(model: DecoderLM, device: torch.device, seed: int = DUMMY_SEED) -> dict[str, torch.Tensor]:
    """A state dict for `model` (built on the meta device), every tensor on `device` in the model's dtype: norm
    weights are ones (their initial value), the rest N(0, INIT_STD^2) from a generator seeded with `seed`. A
    tied output head is left out: the loader points it at the embedding, as for a checkpoint."""
    dtype = model.config.dtype
    generator = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name.endswith("norm.weight"):
            state[name] = torch.ones(tensor.shape, dtype=dtype, device=device)
        else:
            state[name] = torch.randn(tensor.shape, generator=generator, dtype=dtype, device=device).mul_(INIT_STD)
    return state
