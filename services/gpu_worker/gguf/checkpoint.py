"""A GGUF file's tensors under the Hugging Face names the loader maps to DecoderLM: quantized ones as WeightGrids,
the others as fp32 tensors; llama.cpp's row permutation of q/k projections undone."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from gguf import GGUFReader

from pagedserve.kernels.cpu.weight_grid import WeightGrid
from pagedserve.services.gpu_worker.gguf.blocks import PLAIN_TYPES, check_type, grid_from_blocks, plain_tensor
from pagedserve.services.gpu_worker.model_config import ModelConfig

Weight = torch.Tensor | WeightGrid
_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
          "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_IGNORED = ("rope_freqs.weight",)  # llama 3's rope factors: recomputed from the config
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_PERMUTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")  # llama.cpp's converter permutes their q/k


def hf_name(name: str) -> str:
    """A GGUF tensor name -> the Hugging Face one (ValueError for names no supported model has)."""
    top, _, kind = name.rpartition(".")
    if top in _TOP:
        return f"{_TOP[top]}.{kind}"
    match = _BLOCK_NAME.match(name)
    if match is None or match.group(2) not in _LAYER:
        raise ValueError(f"GGUF tensor {name!r} belongs to no supported architecture")
    layer, module, kind = match.groups()
    return f"model.layers.{layer}.{_LAYER[module]}.{kind}"


def read_gguf(path: str | Path, config: ModelConfig) -> dict[str, Weight]:
    """Every tensor of the GGUF file at `path`, renamed, q/k rows in Hugging Face order."""
    reader = GGUFReader(str(path))
    for tensor in reader.tensors:  # refuse before converting anything
        check_type(tensor.name, tensor.tensor_type)
    out: dict[str, Weight] = {}
    for tensor in reader.tensors:
        if tensor.name in _IGNORED:
            continue
        name = hf_name(tensor.name)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest dimension first
        if tensor.tensor_type in PLAIN_TYPES:
            weight: Weight = plain_tensor(tensor.data, tensor.tensor_type, shape)
        else:
            weight = grid_from_blocks(tensor.data, tensor.tensor_type, *shape)
        out[name] = _unpermuted(name, weight, config)
    return out


def _unpermuted(name: str, weight: Weight, config: ModelConfig) -> Weight:
    """llama.cpp stores each head's q/k rows of llama-style models as interleaved pairs (its rope's order):
    back to the halves Hugging Face's rotary embedding expects."""
    if config.architecture not in _PERMUTED_ARCHITECTURES:
        return weight
    if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
        heads = config.num_heads
    elif name.endswith("self_attn.k_proj.weight") or name.endswith("self_attn.k_proj.bias"):
        heads = config.num_kv_heads
    else:
        return weight
    order = torch.arange(heads * config.head_dim).view(heads, config.head_dim // 2, 2).transpose(1, 2).reshape(-1)
    return select_rows(weight, order)


def select_rows(weight: Weight, rows: torch.Tensor) -> Weight:
    if isinstance(weight, torch.Tensor):
        return weight[rows].contiguous()
    return WeightGrid(weight.codes[rows].contiguous(), weight.scales[rows].contiguous(),
                      weight.offsets[rows].contiguous(), weight.bits, weight.group)


def concat_rows(parts: list[Weight]) -> Weight:
    """Weights stacked along their rows (q|k|v, gate|up): grids of one format stay one; grids of several formats
    become 8-bit codes over the smallest group (lossless: GGUF Q4_K_M keeps some v projections in Q6_K); with
    any plain part, all are dequantized."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    if any(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat([p if isinstance(p, torch.Tensor) else dequantize(p) for p in parts])
    formats = {(p.bits, p.group) for p in parts}
    bits, group = formats.pop() if len(formats) == 1 else (8, min(p.group for p in parts))
    parts = [_widened(p, bits, group) for p in parts]
    return WeightGrid(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                      torch.cat([p.offsets for p in parts]), bits, group)


def _widened(grid: WeightGrid, bits: int, group: int) -> WeightGrid:
    repeat = grid.group // group
    codes = grid.codes if grid.bits == bits else grid.codes.to(torch.int8)
    return WeightGrid(codes, grid.scales.repeat_interleave(repeat, 1), grid.offsets.repeat_interleave(repeat, 1),
                      bits, group)


def dequantize(grid: WeightGrid) -> torch.Tensor:
    """The grid's fp32 weights (ggml's dequantization, bit for bit)."""
    out, inputs = grid.codes.shape
    groups = grid.codes.view(out, -1, grid.group).float()
    return (groups * grid.scales.unsqueeze(-1) + grid.offsets.unsqueeze(-1)).view(out, inputs)
