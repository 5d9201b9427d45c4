"""`--load-format dummy`: a folder with only config.json and a tokenizer serves, deterministically for a seed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pagedserve.llm import LLM
from pagedserve.services.gpu_worker.__main__ import main as worker_main
from pagedserve.services.gpu_worker.attention.torch_backend import TorchAttentionBackend
from pagedserve.services.gpu_worker.dummy_weights import INIT_STD, dummy_state
from pagedserve.services.gpu_worker.loader import load_model
from pagedserve.services.gpu_worker.model import DecoderLM
from pagedserve.services.gpu_worker.model_config import load_model_config
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from pagedserve.services.gpu_worker.worker_config import WorkerConfig
from pagedserve.shared.model_dir import model_dir_problem
from pagedserve.shared.sampling_params import SamplingParams
from tests.unit.gpu_worker.tiny_models import TINY_CONFIGS

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
PROMPTS = [[5, 17, 42, 8, 99, 3], [11, 2, 2, 70]]


@pytest.fixture(scope="module")
def shape_only_dir(tmp_path_factory, smollm2_dir) -> Path:
    """The tiny Llama's config.json and SmolLM2's tokenizer files: no weights."""
    folder = tmp_path_factory.mktemp("shape-only")
    config = TINY_CONFIGS["llama"]()
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_dir / name, folder / name)
    assert not list(folder.glob("*.safetensors"))
    return folder


def _model(folder: Path, seed: int) -> tuple[DecoderLM, dict[str, torch.Tensor]]:
    config = load_model_config(folder, "float32")
    model = DecoderLM(config, TorchAttentionBackend(None), 64)  # on the meta device: shapes only
    return model, dummy_state(model, torch.device("cpu"), seed)


def test_state_is_seeded_and_shaped(shape_only_dir):
    model, first = _model(shape_only_dir, seed=0)
    _, again = _model(shape_only_dir, seed=0)
    _, other = _model(shape_only_dir, seed=1)
    expected = {name: t.shape for name, t in model.state_dict().items() if name != "lm_head.weight"}  # tied
    assert {name: t.shape for name, t in first.items()} == expected
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["layers.0.self_attn.qkv_proj.weight"], other["layers.0.self_attn.qkv_proj.weight"])
    assert torch.equal(first["norm.weight"], torch.ones(model.config.hidden_size))
    assert abs(first["embed_tokens.weight"].std().item() - INIT_STD) < 0.1 * INIT_STD


def test_loader_ties_the_head_to_the_dummy_embedding(shape_only_dir):
    config = load_model_config(shape_only_dir, "float32")
    platform = CpuPlatform(native_kernels=False, torch_compile=False)
    model = load_model(shape_only_dir, config, TorchAttentionBackend(None), 64, platform, load_format="dummy")
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    assert model.lm_head.weight.device.type == "cpu"


def test_without_dummy_the_missing_weights_are_refused(shape_only_dir):
    assert "safetensors" in model_dir_problem(str(shape_only_dir), tokenizer=False)
    assert model_dir_problem(str(shape_only_dir), weights=False) is None
    with pytest.raises(SystemExit):
        worker_main([str(shape_only_dir), "--load-format", "bogus"])


def _generate(folder: Path) -> list[list[int]]:
    config = WorkerConfig(model_dir=str(folder), load_format="dummy", device="cpu", dtype="float32",
                          kv_cache_memory_bytes=2**22, torch_compile=False, native_kernels=False)
    return [c.token_ids for c in LLM(config).generate(PROMPTS, GREEDY)]


def test_in_process_engine_serves_dummy_weights_deterministically(shape_only_dir):
    first, second = _generate(shape_only_dir), _generate(shape_only_dir)
    assert first == second
    assert all(len(tokens) == GREEDY.max_tokens for tokens in first)
    assert first[0] != first[1]  # the prompts, through the weights, decide the tokens


def test_serve_accepts_a_folder_without_weights_only_with_dummy(shape_only_dir):
    from pagedserve.services import launcher
    from pagedserve.services.ports import free_port

    refused = launcher.checked_config([str(shape_only_dir), "--port", str(free_port())], "pagedserve serve")
    assert isinstance(refused, str) and "safetensors" in refused
    accepted = launcher.checked_config([str(shape_only_dir), "--port", str(free_port()), "--load-format", "dummy"],
                                       "pagedserve serve")
    assert not isinstance(accepted, str) and accepted.worker.worker.load_format == "dummy"
