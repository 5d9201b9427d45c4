"""A tiny random Llama through the CUDA platform's bindings (Triton interpreted on CPU) with an fp8 KV cache vs the
fp16 one: the same greedy path, logits within a bound; the per-layer scales reach the kernels.

Seen: max |logit error| 0.0098 with unit scales, logits up to 1.34 (a 20-token prompt, 3 decode steps; about 30 s
interpreted: three runs of a 2-layer model through every Triton kernel); the bound below is 5x that.
"""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.attention.backend import KVScales
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from tests.unit.gpu_worker.tiny_models import PagedModel, make_tiny_model

PROMPT = [(7 * i + 3) % 100 + 1 for i in range(20)]
DECODES = 3
_FORCED = [11, 42, 5, 77, 23, 64, 9, 31][:DECODES]


def _logits(folder, kv_dtype: torch.dtype, device: torch.device, scales: KVScales | None = None) -> torch.Tensor:
    """Prompt logits, then each decode step's over the same fixed tokens (every run sees the same inputs)."""
    paged = PagedModel(folder, block_size=16, num_blocks=8, backend="triton", dtype="float16",
                       platform=CudaPlatform(device), kv_dtype=kv_dtype)
    if scales is not None:
        for layer in paged.model.layers:
            layer.self_attn.kv_scales = scales
    state = paged.new_request("a", PROMPT)
    rows = [paged.step([(state, len(PROMPT))])["a"]]
    for token in _FORCED:
        state.token_ids.append(token)
        rows.append(paged.step([(state, 1)])["a"])
    return torch.cat(rows).float()


def test_fp8_cache_logits_stay_close_to_fp16(tmp_path, device) -> None:
    make_tiny_model("llama", tmp_path)
    fp16 = _logits(tmp_path, torch.float16, device)
    fp8 = _logits(tmp_path, torch.float8_e4m3fn, device)
    error = (fp8 - fp16).abs().max().item()
    print(f"max |logit error| fp8 vs fp16 KV: {error:.4f} (logits up to {fp16.abs().max().item():.2f})")
    assert 0 < error < 0.05  # > 0: the cache really is e4m3
    # Scales != 1 change what is stored (value / scale) and are undone on read: still close to fp16.
    scaled = _logits(tmp_path, torch.float8_e4m3fn, device, KVScales(0.25, 0.5))
    assert 0 < (scaled - fp16).abs().max().item() < 0.05
    assert not torch.equal(scaled, fp8)
