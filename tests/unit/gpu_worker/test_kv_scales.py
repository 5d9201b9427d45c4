"""A checkpoint's fp8 KV scales (model.layers.N.self_attn.k_scale / v_scale) reach layer N's attention; layers
without them keep 1.0; a scale that is not one positive number is refused."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.services.gpu_worker.attention.backend import KVScales
from pagedserve.services.gpu_worker.kv_scales import pop_kv_scales
from tests.unit.gpu_worker.tiny_models import PagedModel, make_tiny_model


def _with_tensors(folder, extra: dict[str, torch.Tensor]) -> None:
    path = folder / "model.safetensors"
    save_file({**load_file(str(path)), **extra}, str(path))


def test_checkpoint_scales_reach_their_layers(tmp_path) -> None:
    make_tiny_model("llama", tmp_path)
    _with_tensors(tmp_path, {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
                             "model.layers.0.self_attn.v_scale": torch.tensor([2.0]),
                             "model.layers.1.self_attn.v_scale": torch.tensor(0.25)})
    layers = PagedModel(tmp_path).model.layers
    assert [layer.self_attn.kv_scales for layer in layers] == [KVScales(0.5, 2.0), KVScales(1.0, 0.25)]


def test_a_checkpoint_without_scales_keeps_unit_scales(tmp_path) -> None:
    make_tiny_model("llama", tmp_path)
    assert all(layer.self_attn.kv_scales == KVScales() for layer in PagedModel(tmp_path).model.layers)


@pytest.mark.parametrize("bad", [torch.tensor(0.0), torch.tensor([1.0, 2.0]), torch.tensor(float("nan"))])
def test_a_bad_scale_is_refused(bad: torch.Tensor) -> None:
    checkpoint = {"model.layers.3.self_attn.k_scale": bad, "model.norm.weight": torch.ones(4)}
    with pytest.raises(ValueError, match="layers.3.self_attn.k_scale: a KV cache scale must be one positive"):
        pop_kv_scales(checkpoint)


def test_pop_leaves_the_weights() -> None:
    checkpoint = {"model.layers.2.self_attn.v_scale": torch.tensor(3.0), "model.norm.weight": torch.ones(4)}
    assert pop_kv_scales(checkpoint) == {2: KVScales(1.0, 3.0)}
    assert list(checkpoint) == ["model.norm.weight"]
