"""Section: what the run ran on, and a graph-capture probe (a Triton kernel and a GEMM captured and replayed)."""

from __future__ import annotations

import os
import platform
import time

import torch

from pagedserve.benchmarks.device.context import Section


def _versions() -> dict:
    import transformers
    import triton

    row = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
           "transformers": transformers.__version__, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET")}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        row.update(gpu=props.name, sm_count=props.multi_processor_count, memory_gib=props.total_memory / 2**30,
                   l2_mib=props.L2_cache_size / 2**20, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version(), capability=f"{props.major}.{props.minor}")
    return row


def capture_probe(device: torch.device) -> dict:
    """Capture silu-mul (Triton) and a GEMM in one graph, replay it on new inputs, compare with eager."""
    from pagedserve.kernels.silu_and_mul import fused_silu_and_mul

    gen = torch.Generator(device=device).manual_seed(0)
    weight = torch.randn(256, 128, generator=gen, device=device, dtype=torch.bfloat16)
    static_in = torch.randn(4, 512, generator=gen, device=device, dtype=torch.bfloat16)

    def step() -> torch.Tensor:
        return fused_silu_and_mul(static_in) @ weight.T

    step()  # compiles outside the capture
    torch.cuda.synchronize()
    start = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    capture_s = time.perf_counter() - start
    static_in.copy_(torch.randn(4, 512, generator=gen, device=device, dtype=torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    return {"graph_capture": "ok" if torch.equal(static_out, step()) else "replay differs from eager",
            "probe_capture_s": capture_s}


def run(section: Section) -> str | None:
    section.row(**_versions())
    if section.device.type != "cuda":
        section.row(graph_capture="needs cuda: CUDA graphs capture CUDA streams (graph-timed rows use the wall clock"
                    " in a dry run)")
        return None
    try:
        probe = capture_probe(section.device)
    except Exception as exc:
        probe = {"graph_capture": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    section.row(**probe)
    section.state.capture_ok = probe["graph_capture"] == "ok"
    if not section.state.capture_ok:
        section.note("graph capture failed here: graph timing falls back to CUDA events, graph runs are skipped")
    return None
