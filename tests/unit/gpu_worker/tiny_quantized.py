"""Tiny random Llama / Qwen2 checkpoints quantized as users download them, and the fp32 transformers models of
the same weights dequantized (the reference our logits must match).

- GPTQ: written here following AutoGPTQ's published packing (qweight [in / 8, out] int32 packed along inputs,
  qzeros [groups, out / 8] packed along outputs holding zero - 1, scales [groups, out] fp16, g_idx [in]);
  asymmetric min/max grids as GPTQ's quantizer makes them (range widened to hold 0); act-order as a permutation
  of the inputs whose consecutive runs of `group` form the groups.
- AWQ: written here following AutoAWQ's GEMM packing (qweight [in, out / 8] and qzeros [groups, out / 8] packed
  along outputs in the order 0, 2, 4, 6, 1, 3, 5, 7; zeros stored as they are).
- FP8: compressed-tensors' own FloatQuantizationCompressor writes the float-quantized format.
gptqmodel and autoawq need CUDA to install; the two int4 writers are therefore the tests' own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
from safetensors.torch import save_file

from tests.unit.gpu_worker.tiny_gguf import CONFIGS

CLASSES = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def tiny_model(arch: str, seed: int = 0) -> torch.nn.Module:
    """The random fp32 model, its non-projection tensors rounded to fp16 (as the checkpoints store them)."""
    torch.manual_seed(seed)
    config = CONFIGS[arch]()
    config._attn_implementation = "eager"
    model = CLASSES[arch](config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
            param.copy_(param.half().float())
    return model


def _is_projection(name: str) -> bool:
    return name.endswith(".weight") and name.rsplit(".", 2)[-2] in PROJECTIONS


def _int4_grid(weight: torch.Tensor, columns: torch.Tensor, group: int, widen_to_zero: bool):
    """codes [out, in], zeros and fp16 scales [groups, out]: asymmetric 4-bit grid over each run of `group`
    of `columns` (the inputs in quantization order)."""
    out_features, in_features = weight.shape
    grouped = weight[:, columns].view(out_features, -1, group)
    low, high = grouped.amin(-1), grouped.amax(-1)
    if widen_to_zero:  # GPTQ's quantizer keeps 0 representable
        low, high = low.clamp(max=0), high.clamp(min=0)
    scale = ((high - low) / 15).clamp(min=1e-5).half().float()
    zero = (-low / scale).round().clamp(1, 15)  # GPTQ v1 cannot store zero 0 (it stores zero - 1)
    codes = (grouped / scale.unsqueeze(-1) + zero.unsqueeze(-1)).round().clamp(0, 15)
    dequantized = ((codes - zero.unsqueeze(-1)) * scale.unsqueeze(-1)).view(out_features, in_features)
    unpermuted_codes = torch.empty(out_features, in_features)
    unpermuted_codes[:, columns] = codes.view(out_features, in_features)
    values = torch.empty_like(weight)
    values[:, columns] = dequantized
    return unpermuted_codes.to(torch.int64), zero.T.to(torch.int64), scale.T.half().contiguous(), values


def _pack(nibbles: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """int64 codes 0-15 -> int32 words of 8 along `dim`; nibble j holds element 8c + order[j]."""
    moved = nibbles.movedim(dim, -1)
    moved = moved.reshape(*moved.shape[:-1], -1, 8)[..., list(order)]
    words = sum((moved[..., j] & 15) << (4 * j) for j in range(8))
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def _quantized(arch: str, seed: int, quantize: Callable[[str, torch.Tensor], dict[str, torch.Tensor]]
               ) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """(the unquantized model, the model of the dequantized weights, the checkpoint's tensors): `quantize(prefix,
    weight)` gives each projection's stored tensors and overwrites `weight` with its dequantized values; every other
    tensor is stored as fp16."""
    original, reference = tiny_model(arch, seed), tiny_model(arch, seed)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, param in reference.state_dict().items():
            if _is_projection(name):
                tensors |= quantize(name.removesuffix(".weight"), param)
            else:
                tensors[name] = param.half()
    return original, reference, tensors


def write_gptq(arch: str, folder: Path, group: int = 128, act_order: bool = False, seed: int = 0):
    """AutoGPTQ's layout; returns (the fp32 model of the dequantized weights, the unquantized model)."""
    generator = torch.Generator().manual_seed(seed)

    def quantize(prefix: str, param: torch.Tensor) -> dict[str, torch.Tensor]:
        in_features = param.shape[1]
        columns = torch.randperm(in_features, generator=generator) if act_order else torch.arange(in_features)
        codes, zeros, scales, values = _int4_grid(param, columns, group, widen_to_zero=True)
        param.copy_(values)
        g_idx = torch.empty(in_features, dtype=torch.int32)
        g_idx[columns] = (torch.arange(in_features) // group).to(torch.int32)
        return {f"{prefix}.qweight": _pack(codes.T, 0), f"{prefix}.qzeros": _pack(zeros - 1, 1),
                f"{prefix}.scales": scales, f"{prefix}.g_idx": g_idx}

    original, reference, tensors = _quantized(arch, seed, quantize)
    _save(reference, folder, tensors, {"quant_method": "gptq", "bits": 4, "group_size": group,
                                       "desc_act": act_order, "sym": False, "checkpoint_format": "gptq"})
    return reference, original


def write_awq(arch: str, folder: Path, group: int = 128, seed: int = 0):
    """AutoAWQ's GEMM layout; returns (the fp32 model of the dequantized weights, the unquantized model)."""
    def quantize(prefix: str, param: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, zeros, scales, values = _int4_grid(param, torch.arange(param.shape[1]), group, False)
        param.copy_(values)
        return {f"{prefix}.qweight": _pack(codes.T, 1, AWQ_ORDER), f"{prefix}.qzeros": _pack(zeros, 1, AWQ_ORDER),
                f"{prefix}.scales": scales}

    original, reference, tensors = _quantized(arch, seed, quantize)
    _save(reference, folder, tensors, {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                       "version": "gemm"})
    return reference, original


def write_fp8(arch: str, folder: Path, strategy: str = "channel", activations: bool = True, seed: int = 0):
    """compressed-tensors float-quantized (FloatQuantizationCompressor): FP8 weights with dynamic per-token FP8
    activations (llm-compressor's FP8_DYNAMIC) or, without `activations`, weights only (naive-quantized, as
    compressed-tensors names a W8A16 format); returns (the fp32 model of the dequantized weights, the
    unquantized model)."""
    args = QuantizationArgs(num_bits=8, type="float", strategy=strategy, symmetric=True, dynamic=False)
    dynamic = QuantizationArgs(num_bits=8, type="float", strategy="token", symmetric=True, dynamic=True)
    scheme = QuantizationScheme(targets=["Linear"], weights=args, input_activations=dynamic if activations else None)

    def quantize(prefix: str, param: torch.Tensor) -> dict[str, torch.Tensor]:
        absmax = param.abs().amax(dim=1, keepdim=True) if strategy == "channel" else param.abs().amax().view(1)
        scale = (absmax / torch.finfo(torch.float8_e4m3fn).max).half().float()
        packed = FloatQuantizationCompressor.compress({"weight": param, "weight_scale": scale}, scheme)
        param.copy_(packed["weight"].float() * scale)
        return {f"{prefix}.weight": packed["weight"], f"{prefix}.weight_scale": scale}

    original, reference, tensors = _quantized(arch, seed, quantize)
    fmt = "float-quantized" if activations else "naive-quantized"
    config = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, quantization_status="compressed",
                                ignore=["lm_head"])
    _save(reference, folder, tensors, config.model_dump(exclude_none=True))
    return reference, original


def _save(reference: torch.nn.Module, folder: Path, tensors: dict[str, torch.Tensor], quantization: dict) -> None:
    if reference.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = reference.config.to_dict()
    config |= {"architectures": [type(reference).__name__], "torch_dtype": "float16", "dtype": "float16",
               "quantization_config": quantization}
    (folder / "config.json").write_text(json.dumps(config))
