"""GGUF Q5_0 / Q5_1 / Q5_K checkpoints on int8 inputs: their grids are packed as 5-bit codes at load (the log line
names them), and a prompt's logits and its one-call decodes' are bit for bit those of the same file with the grids
packed as 8-bit codes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedserve.kernels.cpu.int8_linear import Int8Weight, pack_grid
from pagedserve.services.gpu_worker.platforms.cpu import linear
from pagedserve.services.gpu_worker.platforms.cpu.linear import CGemmLinear
from pagedserve.services.gpu_worker.platforms.cpu.one_call_decode import OneCallDecode
from pagedserve.services.gpu_worker.platforms.cpu.platform import CpuPlatform
from tests.unit.gpu_worker import tiny_gguf
from tests.unit.gpu_worker.tiny_models import PagedModel


def _heads_of_64(config: Callable) -> Callable:
    """The tiny config with 4 heads of 64 (2 KV heads), as the C decode attention (the one-call path) takes."""
    def make():
        c = config()
        c.num_attention_heads, c.num_key_value_heads, c.head_dim = 4, 2, c.hidden_size // 4
        return c
    return make


def _logits(folder: Path, tokens: list[int], bits: int) -> torch.Tensor:
    """A 17-token prompt, then teacher-forced decodes of the rest, on int8 inputs."""
    platform = CpuPlatform(torch_compile=False, int8_activations=True)
    paged = PagedModel(folder, block_size=16, backend="torch+native", platform=platform)  # the C decode's blocks
    kernels = [m.kernel for m in paged.model.linears()]
    assert all(isinstance(k, CGemmLinear) and isinstance(k.weight, Int8Weight) and k.weight.bits == bits
               for k in kernels)
    assert isinstance(paged.forward, OneCallDecode)
    state = paged.new_request("a", tokens)
    rows = [paged.step([(state, 17)])["a"]] + [paged.step([(state, 1)])["a"] for _ in range(len(tokens) - 17)]
    return torch.cat(rows)


@pytest.mark.parametrize("qtype", [T.Q5_0, T.Q5_1, T.Q5_K], ids=lambda t: t.name)
def test_q5_grids_take_5_bit_codes_and_give_the_8_bit_codes_numbers(qtype: T, tmp_path: Path, caplog,
                                                                     monkeypatch) -> None:
    monkeypatch.setitem(tiny_gguf.CONFIGS, "llama", _heads_of_64(tiny_gguf.CONFIGS["llama"]))
    tiny_gguf.write_tiny_gguf("llama", tmp_path, qtype)
    tokens = torch.randint(0, 300, (23,), generator=torch.Generator().manual_seed(4)).tolist()
    with caplog.at_level(logging.INFO, logger=linear.__name__):
        five = _logits(tmp_path, tokens, 5)
    assert "as 5-bit codes x int8 inputs" in caplog.text and "8-bit" not in caplog.text
    monkeypatch.setattr(linear, "pack_grid", lambda grid: pack_grid(grid, five_bit=False))
    eight = _logits(tmp_path, tokens, 8)
    assert torch.isfinite(five).all() and torch.equal(five, eight)
