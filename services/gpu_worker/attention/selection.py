"""Pick the attention backend for a device: Triton kernels on CUDA, the torch path elsewhere."""

from __future__ import annotations

import os
from typing import get_args

import torch

from services.gpu_worker.attention.backend import AttentionBackend, AttentionShape
from services.gpu_worker.worker_config import AttentionBackendName

BACKEND_NAMES = get_args(AttentionBackendName)


def select_backend(name: str, shape: AttentionShape, device: torch.device, compile_decode: bool = False,
                   native_decode: bool = False) -> AttentionBackend:
    """Build the backend called `name` ("auto" | "torch" | "triton"); auto means triton on CUDA, else torch.
    The torch backend's decode attention runs in the C kernel when `native_decode` (and it builds), else through
    torch.compile when `compile_decode`, else eagerly."""
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown attention backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from services.gpu_worker.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend(shape, compile_decode, native_decode)
    # Triton decides at import time whether kernels compile or run in its interpreter, from this variable.
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"attention backend 'triton' needs a CUDA device, or TRITON_INTERPRET=1 set before start "
                         f"to run its kernels in the (slow) interpreter on {device.type}")
    from services.gpu_worker.attention.triton_backend import TritonAttentionBackend

    return TritonAttentionBackend(shape)
