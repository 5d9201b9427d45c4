"""How many kernels a decoder layer launches at batch 1 under the CUDA platform's bindings (issue 38: <= 12).

Counted with tests/kernels/launch_counter.py (Triton launches + non-view, non-allocating aten calls) on a decode
step of the tiny Llama through Triton's interpreter: the same bindings and call sequence the CUDA platform runs.
Seen: 11 (2 norms, 4 linears, rotary, cache write, decode attention, SiLU-mul, the residual add); a long context
adds the split-K reduce launch: 12.
"""

from __future__ import annotations

import torch

from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.platforms.cuda import CudaPlatform
from tests.kernels.launch_counter import Launches, count_launches
from tests.unit.gpu_worker.tiny_models import PagedModel, make_tiny_model

MAX_KERNELS_PER_LAYER = 12
FUSED = {"triton:_rms_norm_kernel", "triton:_rotary_kernel", "triton:_silu_and_mul_kernel"}


def _layer_launches(platform, tmp_path, backend: str = "triton") -> Launches:
    """The launches of layer 0 during one batch-1 decode step after a 9-token prompt."""
    make_tiny_model("llama", tmp_path)
    paged = PagedModel(tmp_path, backend=backend, platform=platform)
    state = paged.new_request("a", list(range(1, 10)))
    paged.step([(state, 9)])
    state.token_ids.append(7)
    layer = paged.model.layers[0]
    forward = layer.forward
    recorded: list[Launches] = []

    def counted(*args, **kwargs):
        with count_launches() as launches:
            out = forward(*args, **kwargs)
        recorded.append(launches)
        return out

    layer.forward = counted
    paged.step([(state, 1)])
    assert len(recorded) == 1, "layer 0 ran once in the step"
    return recorded[0]


def test_cuda_bindings_launch_at_most_12_kernels_a_layer(tmp_path, device):
    launches = _layer_launches(CudaPlatform(device), tmp_path)
    print(f"{len(launches.names)} kernels: {launches.names}")
    assert len(launches.names) <= MAX_KERNELS_PER_LAYER, launches.names
    assert FUSED <= set(launches.names), launches.names
    products = [name for name in launches.names if name in ("aten:linear", "aten:mm", "aten:addmm")]
    assert len(products) == 4, launches.names  # qkv, o, gate_up, down: one product each
    assert not {"aten:repeat", "aten:cat", "aten:silu", "aten:rsqrt"} & set(launches.names), launches.names


def test_counter_sees_the_unfused_cpu_bindings(tmp_path):
    """The counter is not blind: the portable bindings (two-row linears, torch norms, rotary and SiLU; torch
    attention, so that this runs on CPU wherever Triton compiles) count many more kernels on the same layer."""
    launches = _layer_launches(CpuPlatform(native_kernels=False, torch_compile=False), tmp_path, backend="torch")
    assert len(launches.names) > 2 * MAX_KERNELS_PER_LAYER, launches.names
    assert "aten:repeat" in launches.names and not FUSED & set(launches.names)


def test_counter_counts_a_triton_launch_once_and_skips_views(device):
    from pagedserve.kernels.silu_and_mul import fused_silu_and_mul

    gate_up = torch.ones(3, 8, device=device)
    with count_launches() as launches:
        fused_silu_and_mul(gate_up[1:])
    assert launches.names == ["triton:_silu_and_mul_kernel"]
