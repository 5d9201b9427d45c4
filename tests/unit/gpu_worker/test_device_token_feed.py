"""Sampled ids left on the device (the CUDA path, forced on CPU) give the host path's tokens through the real
scheduler with async scheduling: more than 20 steps, preemptions in a small KV pool and an abort mid-stream."""

from __future__ import annotations

import pytest

from pagedserve.services.gpu_worker.cuda_graphs.graph_backend import FakeGraphBackend
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.worker import Worker
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.request_io import GenerateRequest
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.gpu_worker.tiny_models import make_tiny_model
from tests.unit.pagedserve.engine_runs import run


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    make_tiny_model("llama", path)
    return path


def make_worker(folder, backend: str, defer: bool, graphs: bool) -> Worker:
    worker = Worker(WorkerConfig(model_dir=str(folder), dtype="float32", kv_cache_dtype="float32", device="cpu",
                                 attention_backend=backend, block_size=4, kv_cache_memory_bytes=1024**2,
                                 max_model_len=64, torch_compile=False, native_kernels=False,
                                 int8_activations=False, cuda_graph_sizes="1,2,4", max_num_seqs=4))
    worker.runner.defer_outputs = defer
    if graphs:
        worker.runner.enable_graphs(FakeGraphBackend())
    return worker


def requests() -> list[GenerateRequest]:
    greedy = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (22, 9, 17, 12)]
    return [GenerateRequest(f"r{i}", [(7 * i + k) % 101 for k in range(3 + 2 * i)], sp)
            for i, sp in enumerate(greedy)]


@pytest.mark.parametrize("variant", ["torch", "triton+graphs"])
def test_device_feed_matches_host_path(folder, variant, monkeypatch):
    fed_rows = []
    fed_row = RequestState.fed_row
    monkeypatch.setattr(RequestState, "fed_row", lambda self, step: fed_rows.append(step) or fed_row(self, step))
    backend, graphs = ("triton", True) if variant == "triton+graphs" else ("torch", False)
    host = run(make_worker(folder, backend, defer=False, graphs=False), requests(), True, num_blocks=9,
               aborts={1: 5})
    fed = make_worker(folder, backend, defer=True, graphs=graphs)
    device = run(fed, requests(), True, num_blocks=9, aborts={1: 5})
    assert host.num_preemptions > 0 and device.num_preemptions == host.num_preemptions
    assert device.tokens == host.tokens and device.reasons == host.reasons
    assert sum(len(tokens) for tokens in host.tokens.values()) >= 40 and len(host.tokens["r0"]) == 22
    assert fed.runner._serial >= 20 and len(fed_rows) >= 20  # tokens taken from the device, by index
    if graphs:
        assert sum(g.graph.num_replays for g in fed.runner.graphs.graphs.values()) > 10
