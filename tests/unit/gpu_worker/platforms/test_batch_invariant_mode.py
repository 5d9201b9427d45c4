"""`--batch-invariant` is taken only where it holds: the CPU platform with the C kernels on fp32 or bf16 models;
elsewhere the worker refuses to start, saying why. In the mode, no step runs a kernel that only decodes take: decode
steps of fp32 models still run in one C call, over the prefill attention kernel."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.cpu.paged_prefill import NativePagedPrefill
from pagedserve.services.gpu_worker.attention.backend import AttentionShape
from pagedserve.services.gpu_worker.kv_cache import KVCache
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.platforms import platform_for
from pagedserve.services.gpu_worker.platforms.cpu.one_call_decode import OneCallDecode
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from tests.unit.gpu_worker.platforms.test_one_call_decode import _save

SHAPE = AttentionShape(6, 2, 64, 0.125)


def test_cuda_refuses_it() -> None:
    with pytest.raises(ValueError, match="implemented on CPU only"):
        platform_for(WorkerConfig(model_dir="unused", device="cuda", batch_invariant=True))


@pytest.mark.parametrize(("options", "query_dtype", "message"), [
    ({"native_kernels": False}, torch.bfloat16, "needs the C prefill attention kernel"),
    ({}, torch.float16, "needs the C prefill attention kernel"),
])
def test_the_cpu_refuses_it_without_the_c_prefill_kernel(options: dict, query_dtype: torch.dtype,
                                                         message: str) -> None:
    platform = CpuPlatform(batch_invariant=True, **options)
    with pytest.raises(ValueError, match=message):
        platform.attention_backend("torch", SHAPE, query_dtype, query_dtype, 16)


def test_the_triton_backend_refuses_it() -> None:
    with pytest.raises(ValueError, match="torch attention backend"):
        CpuPlatform(batch_invariant=True).attention_backend("triton", SHAPE, torch.float32, torch.float32, 16)


def test_decode_steps_take_the_one_call_path_over_the_prefill_kernel(tmp_path) -> None:
    """The one-call decode path runs the prefill attention kernel in batch-invariant mode, never the decode one."""
    _save("llama", tmp_path, grid=False)
    config = load_model_config(tmp_path, "float32")
    shape = AttentionShape(config.num_heads, config.num_kv_heads, config.head_dim, config.head_dim ** -0.5)
    platform = CpuPlatform(torch_compile=False, batch_invariant=True)
    backend = platform.attention_backend("torch", shape, torch.float32, torch.float32, 16)
    model = load_model(tmp_path, config, backend, 256, platform)
    forward = platform.model_forward(model, backend, KVCache.allocate(config, 8, 16, platform.device))
    assert isinstance(forward, OneCallDecode) and backend.decodes_as_chunks
    assert forward.layers.kernels.decode is None
    assert isinstance(forward.layers.kernels.prefill, NativePagedPrefill)
