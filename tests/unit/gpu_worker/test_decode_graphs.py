"""Decode graphs through the fake graph backend on CPU (Triton kernels in the interpreter, fp32 tiny models):
padded replays match the eager forward, padding rows write no KV slot, the captured region never syncs with the
host, and two steps of one padded size launch identical kernels."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pagedserve.kernels.cache_write
import pagedserve.kernels.paged_decode_attention
from pagedserve.services.gpu_worker.cuda_graphs.decode_graphs import capture_sizes
from pagedserve.services.gpu_worker.cuda_graphs.graph_backend import FakeGraphBackend
from pagedserve.services.gpu_worker.model_runner import ModelRunner
from pagedserve.services.gpu_worker.request_state import RequestState
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.gpu_worker.tiny_models import make_tiny_model

BLOCK_SIZE = 4
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique")


class HostSyncError(AssertionError):
    pass


class SyncDetector(TorchDispatchMode):
    """Fails on any op that reads a device value on the host (or whose output size depends on values)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if any(op in name for op in SYNC_OPS):  # unique runs as _unique2
            raise HostSyncError(f"{func} inside the captured region")
        return func(*args, **(kwargs or {}))


@contextmanager
def no_host_sync():
    """The detector, plus .tolist() (on CPU it reads memory without dispatching an op)."""
    original = torch.Tensor.tolist

    def tolist(self):
        raise HostSyncError("Tensor.tolist inside the captured region")

    torch.Tensor.tolist = tolist
    try:
        with SyncDetector():
            yield
    finally:
        torch.Tensor.tolist = original


def make_runner(folder, sizes: str = "1,2,4") -> ModelRunner:
    return ModelRunner(WorkerConfig(
        model_dir=str(folder), dtype="float32", device="cpu", attention_backend="triton", block_size=BLOCK_SIZE,
        kv_cache_memory_bytes=2 * 1024**2, max_model_len=64, torch_compile=False, native_kernels=False,
        int8_activations=False, cuda_graph_sizes=sizes, max_num_seqs=4))


def request(req_id: str, prompt: list[int], first_block: int) -> RequestState:
    blocks = list(range(first_block, first_block + 4))  # 16 tokens of room
    return RequestState(req_id, list(prompt), len(prompt), SamplingParams(temperature=0.0), blocks, 0, ())


def prefill(runner: ModelRunner, requests: list[RequestState]) -> None:
    """Compute each prompt eagerly and append its greedy token, so that the next step is a decode of each."""
    runner.run(requests, [len(r.token_ids) for r in requests])


def snapshot(runner: ModelRunner) -> list[torch.Tensor]:
    return [t.clone() for t in runner.kv_cache.key_caches + runner.kv_cache.value_caches]


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral"])
def folder(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_tiny_model(request.param, path)
    return path


def test_capture_sizes_follow_the_ladder_and_max_num_seqs():
    assert capture_sizes("", 20) == (1, 2, 4, 8, 16)
    assert capture_sizes("8, 2,2", 64) == (2, 8)
    with pytest.raises(ValueError):
        capture_sizes("0,4", 8)


@torch.inference_mode()
def test_padded_graph_matches_eager_and_padding_writes_no_slot(folder):
    runner = make_runner(folder)
    fake = FakeGraphBackend()
    runner.enable_graphs(fake)
    graphs = runner.graphs
    requests = [request("a", [3, 5, 7, 9, 11], 0), request("b", [2, 4], 8), request("c", [6, 1, 8, 2, 9, 4, 7], 16)]
    prefill(runner, requests)
    before = snapshot(runner)
    eager = runner.forward  # the eager forward over an unpadded batch, as the runner builds it without graphs
    runner.graphs = None
    from pagedserve.services.gpu_worker.input_batch import build_model_input

    batch = build_model_input(requests, [1, 1, 1], BLOCK_SIZE, runner.device)
    expected = runner.model.compute_logits(eager(batch.token_ids, batch.positions, runner.kv_cache.layers,
                                                 batch.meta, None), batch.meta.rows)
    eager_kv = snapshot(runner)
    for tensor, saved in zip(runner.kv_cache.key_caches + runner.kv_cache.value_caches, before, strict=True):
        tensor.copy_(saved)  # back to the state before the decode step
    runner.graphs = graphs
    logits = graphs.run(requests, previous_step=-1, previous_sampled=None)

    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert graphs.graphs[4].graph.num_replays == 1  # 3 decodes ran padded to 4
    real_slots = {r.block_ids[r.num_computed_tokens // BLOCK_SIZE] * BLOCK_SIZE + r.num_computed_tokens % BLOCK_SIZE
                  for r in requests}
    for after, old, reference in zip(snapshot(runner), before, eager_kv, strict=True):
        flat_after, flat_old = after.flatten(0, 1), old.flatten(0, 1)
        untouched = [s for s in range(flat_after.shape[0]) if s not in real_slots]
        assert torch.equal(flat_after[untouched], flat_old[untouched])  # padding rows wrote nowhere
        torch.testing.assert_close(after, reference, atol=1e-5, rtol=1e-5)  # the real rows' keys and values


def test_sync_detector_fails_on_host_reads():
    device_value = torch.tensor([1.0, 0.0])
    for read in (lambda: device_value.sum().item(), lambda: device_value.nonzero(),
                 lambda: device_value.masked_select(device_value > 0), lambda: device_value.unique(),
                 lambda: device_value.tolist()):
        with pytest.raises(HostSyncError), no_host_sync():
            read()


def test_captured_region_never_syncs(folder):
    def capture_without_sync(run):
        with no_host_sync():
            run()

    runner = make_runner(folder, sizes="1,2")
    runner.enable_graphs(FakeGraphBackend(on_capture=capture_without_sync))
    assert sorted(runner.graphs.graphs) == [1, 2]


class LaunchRecorder:
    """Wraps a Triton kernel: records each launch's grid and non-tensor arguments, then runs it."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            scalars = tuple(a for a in args if not isinstance(a, torch.Tensor))
            self.launches.append((self.kernel.fn.__name__ if hasattr(self.kernel, "fn") else str(self.kernel),
                                  tuple(grid), scalars, tuple(sorted(kwargs.items()))))
            return self.kernel[grid](*args, **kwargs)

        return launch


@torch.inference_mode()
def test_two_steps_of_one_padded_size_launch_the_same_kernels(folder, monkeypatch):
    launches: list = []
    for module, name in ((pagedserve.kernels.paged_decode_attention, "_decode_split_kernel"),
                         (pagedserve.kernels.paged_decode_attention, "_decode_reduce_kernel"),
                         (pagedserve.kernels.cache_write, "_cache_write_kernel")):
        monkeypatch.setattr(module, name, LaunchRecorder(getattr(module, name), launches))
    runner = make_runner(folder)
    monkeypatch.setattr(pagedserve.kernels.paged_decode_attention, "MIN_PARTITION",
                        8)  # several splits on tiny contexts
    runner.backend.num_sms = 64  # and on CPU
    runner.enable_graphs(FakeGraphBackend())
    first = [request("a", [3, 5, 7, 9, 11, 2, 4, 6, 8], 0), request("b", [2, 4], 8), request("c", [6, 1], 16)]
    second = [request("d", [1], 40), request("e", [9, 8, 7, 6, 5, 4, 3], 28), request("f", [4] * 12, 32)]
    prefill(runner, first)
    prefill(runner, second)
    recorded = []
    for requests in (first, second):
        launches.clear()
        runner.graphs.run(requests, previous_step=-1, previous_sampled=None)  # padded to 4 both times
        recorded.append(list(launches))
    assert [r.num_computed_tokens for r in first] != [r.num_computed_tokens for r in second]
    assert recorded[0] and recorded[0] == recorded[1]
    assert any(name.startswith("_decode_reduce") for name, *_ in recorded[0])  # split-K ran
