"""Tensor parallelism on CPU with gloo: TP = 2 and 3 give the logits of TP = 1 (fp32, within 1e-5) for tiny Llama,
Qwen2, Qwen3 and Mistral models, over a prompt, a chunked prompt and decodes through the paged KV cache; heads
that do not split are refused."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from pagedserve.services.gpu_worker.model_config import UnsupportedModelError, load_model_config
from pagedserve.services.gpu_worker.parallel.group import free_init_method, join_group, leave_group
from pagedserve.services.gpu_worker.parallel.shard_plan import ShardPlan
from tests.unit.gpu_worker.parallel.tp_models import TP_MODELS, make_tp_model, run_steps

SPLIT_BOTH = ["llama", "qwen2", "qwen3", "mistral"]  # 6 heads; 6 or 1 KV heads: split or replicated by 2 and 3


def _rank_main(rank: int, world_size: int, init_method: str, folders: dict, results) -> None:
    torch.set_num_threads(1)
    tp = join_group(rank, world_size, init_method, torch.device("cpu"), 30.0)
    try:
        for name, folder in folders.items():
            logits = run_steps(folder, tp)
            if rank == 0:
                results.put((name, logits))
    finally:
        leave_group()


def _run_tp(folders: dict, world_size: int) -> dict[str, list[torch.Tensor]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    init_method = free_init_method()
    ranks = [context.Process(target=_rank_main, args=(rank, world_size, init_method, folders, results))
             for rank in range(world_size)]
    for process in ranks:
        process.start()
    out = dict(results.get(timeout=240) for _ in folders)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0, f"rank {process.name} exited with {process.exitcode}"
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tp-models")
    for name in TP_MODELS:
        make_tp_model(name, root / name)
    return {name: root / name for name in TP_MODELS}


@pytest.mark.parametrize("world_size", [2, 3])
def test_tensor_parallel_logits_equal_single_rank(folders, world_size):
    names = SPLIT_BOTH + (["llama-3kv"] if world_size == 3 else [])
    parallel = _run_tp({name: folders[name] for name in names}, world_size)
    for name in names:
        reference = run_steps(folders[name], None)
        assert len(parallel[name]) == len(reference)
        for step, (got, want) in enumerate(zip(parallel[name], reference, strict=True)):
            assert got.shape == want.shape and got.shape[1] == 101, (name, step, got.shape)
            error = (got - want).abs().max().item()
            assert error <= 1e-5, f"{name} step {step}: logits differ by {error}"
            assert want.std() > 0.1  # real logits, not a constant both sides share


def test_kv_heads_replicate_when_fewer_than_ranks(folders):
    config = load_model_config(folders["mistral"], "float32")  # 6 heads, 1 KV head
    plans = [ShardPlan.for_rank(config, rank, 3) for rank in range(3)]
    assert [(p.num_heads, p.num_kv_heads, p.first_kv_head) for p in plans] == [(2, 1, 0)] * 3
    config = load_model_config(folders["llama-3kv"], "float32")
    assert [ShardPlan.for_rank(config, r, 3).first_kv_head for r in range(3)] == [0, 1, 2]


def test_heads_that_do_not_split_are_refused(folders):
    with pytest.raises(UnsupportedModelError, match="tensor-parallel-size 2 does not divide .* 3 KV heads"):
        ShardPlan.for_rank(load_model_config(folders["llama-3kv"], "float32"), 0, 2)
    with pytest.raises(UnsupportedModelError, match="tensor-parallel-size 4 does not divide .* 6 attention heads"):
        ShardPlan.for_rank(load_model_config(folders["llama"], "float32"), 0, 4)
